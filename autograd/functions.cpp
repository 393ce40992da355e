// Backward formulas of the differentiable tensor ops, and the recording that attaches them.
#include <algorithm>
#include <cmath>
#include <limits>

#include <ember/tensor/detail/attention.h>
#include <ember/tensor/detail/autograd_hooks.h>
#include <ember/tensor/detail/layer_backward.h>
#include <ember/tensor/detail/op_utils.h>
#include <ember/tensor/grad_mode.h>
#include <ember/tensor/ops.h>

#include "engine.h"
#include "node.h"

namespace ember::autograd {

using detail::OpArgs;
using detail::OpId;

namespace {

const char* op_name(OpId op) {
  switch (op) {
    case OpId::kAdd:
      return "AddBackward";
    case OpId::kSub:
      return "SubBackward";
    case OpId::kMul:
      return "MulBackward";
    case OpId::kDiv:
      return "DivBackward";
    case OpId::kPow:
      return "PowBackward";
    case OpId::kPowScalar:
      return "PowScalarBackward";
    case OpId::kMaximum:
      return "MaximumBackward";
    case OpId::kMinimum:
      return "MinimumBackward";
    case OpId::kNeg:
      return "NegBackward";
    case OpId::kAbs:
      return "AbsBackward";
    case OpId::kExp:
      return "ExpBackward";
    case OpId::kLog:
      return "LogBackward";
    case OpId::kSqrt:
      return "SqrtBackward";
    case OpId::kRsqrt:
      return "RsqrtBackward";
    case OpId::kRelu:
      return "ReluBackward";
    case OpId::kSigmoid:
      return "SigmoidBackward";
    case OpId::kTanh:
      return "TanhBackward";
    case OpId::kClamp:
      return "ClampBackward";
    case OpId::kWhere:
      return "WhereBackward";
    case OpId::kCast:
      return "ToCopyBackward";
    case OpId::kReshape:
      return "ReshapeBackward";
    case OpId::kTranspose:
      return "TransposeBackward";
    case OpId::kPermute:
      return "PermuteBackward";
    case OpId::kSlice:
      return "SliceBackward";
    case OpId::kSelect:
      return "SelectBackward";
    case OpId::kExpand:
      return "ExpandBackward";
    case OpId::kClone:
      return "CloneBackward";
    case OpId::kSum:
      return "SumBackward";
    case OpId::kMean:
      return "MeanBackward";
    case OpId::kMaxAll:
      return "MaxBackward";
    case OpId::kMinAll:
      return "MinBackward";
    case OpId::kMaxDim:
      return "MaxDimBackward";
    case OpId::kMinDim:
      return "MinDimBackward";
    case OpId::kVar:
      return "VarBackward";
    case OpId::kNorm:
      return "NormBackward";
    case OpId::kMm:
      return "MmBackward";
    case OpId::kBmm:
      return "BmmBackward";
    case OpId::kAddmm:
      return "AddmmBackward";
    case OpId::kSoftmax:
      return "SoftmaxBackward";
    case OpId::kLogSoftmax:
      return "LogSoftmaxBackward";
    case OpId::kCat:
      return "CatBackward";
    case OpId::kIndexSelect:
      return "IndexSelectBackward";
    case OpId::kGather:
      return "GatherBackward";
    case OpId::kScatterAdd:
      return "ScatterAddBackward";
    case OpId::kConv2d:
      return "Conv2dBackward";
    case OpId::kBatchNorm:
      return "BatchNormBackward";
    case OpId::kMaxPool2d:
      return "MaxPool2dBackward";
    case OpId::kAvgPool2d:
      return "AvgPool2dBackward";
    case OpId::kAdaptiveAvgPool2d:
      return "AdaptiveAvgPool2dBackward";
    case OpId::kDropout:
      return "DropoutBackward";
    case OpId::kCrossEntropy:
      return "CrossEntropyBackward";
    // attention
    case OpId::kScaledDotProductAttention:
      return "ScaledDotProductAttentionBackward";
    // GPT layers
    case OpId::kGelu:
      return "GeluBackward";
    case OpId::kLayerNorm:
      return "LayerNormBackward";
    case OpId::kEmbedding:
      return "EmbeddingBackward";
    // fused layers
    case OpId::kBatchNormRelu:
      return "BatchNormReluBackward";
    case OpId::kBatchNormAddRelu:
      return "BatchNormAddReluBackward";
    case OpId::kBiasActivation:
      return "BiasActivationBackward";
  }
  return "UnknownBackward";
}

// Which forward tensors a formula reads: inputs by position, and the (first) output.
struct SavePlan {
  std::vector<int> inputs;
  bool output = false;
};

SavePlan save_plan(OpId op) {
  switch (op) {
    case OpId::kMul:
    case OpId::kDiv:
    case OpId::kMaximum:
    case OpId::kMinimum:
    case OpId::kMm:
    case OpId::kBmm:
      return {{0, 1}, false};
    case OpId::kAddmm:
      return {{1, 2}, false};
    case OpId::kPow:
      return {{0, 1}, true};
    case OpId::kPowScalar:
    case OpId::kAbs:
    case OpId::kLog:
    case OpId::kClamp:
    case OpId::kVar:
      return {{0}, false};
    case OpId::kWhere:
      return {{}, false};  // the condition travels in OpArgs::extra
    case OpId::kConv2d:
    case OpId::kBatchNorm:
      return {{0, 1}, false};
    case OpId::kCrossEntropy:
      return {{0}, false};
    // attention: q, k, v and the output (with the logsumexp in extra)
    case OpId::kScaledDotProductAttention:
      return {{0, 1, 2}, true};
    // fused layers: the input and weight for batch norm, the output for the ReLU mask
    case OpId::kBatchNormRelu:
    case OpId::kBatchNormAddRelu:
      return {{0, 1}, true};
    case OpId::kBiasActivation:
      return {{}, true};
    case OpId::kExp:
    case OpId::kSqrt:
    case OpId::kRsqrt:
    case OpId::kRelu:
    case OpId::kSigmoid:
    case OpId::kTanh:
    case OpId::kSoftmax:
    case OpId::kLogSoftmax:
      return {{}, true};
    case OpId::kMaxAll:
    case OpId::kMinAll:
    case OpId::kNorm:
      return {{0}, true};
    // GPT layers
    case OpId::kGelu:
      return {{0}, false};
    case OpId::kLayerNorm:
      return {{0, 1}, false};
    default:
      return {{}, false};
  }
}

struct InputInfo {
  Shape sizes;
  DType dtype = kF32;
  Device device;
  bool needs_grad = false;
};

// g summed over the dims in which `shape` was broadcast to g's shape.
Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.sizes() == shape) return g;
  const int64_t lead = g.dim() - static_cast<int64_t>(shape.size());
  Shape dims;
  for (int64_t d = 0; d < g.dim(); ++d) {
    if (d < lead || (shape[static_cast<size_t>(d - lead)] == 1 && g.size(d) != 1))
      dims.push_back(d);
  }
  Tensor reduced = dims.empty() ? g : sum(g, dims, true);
  return reduced.reshape(shape);
}

// sign(x) as x's dtype: -1, 0 or 1.
Tensor sign_of(const Tensor& x) { return gt(x, 0).to(x.dtype()) - lt(x, 0).to(x.dtype()); }

// A gradient `g` of a reduction over `dims` (keepdim or not) spread back to `sizes`.
Tensor expand_reduced(const Tensor& g, const Shape& sizes, const Shape& dims, bool keepdim) {
  Tensor out = g;
  if (!keepdim && !sizes.empty()) {
    const std::vector<int64_t> wrapped =
        detail::wrap_dims(dims, static_cast<int64_t>(sizes.size()), "backward");
    for (int64_t d : wrapped) out = out.unsqueeze(d);
  }
  return out.expand(sizes);
}

class OpNode final : public Node {
 public:
  OpNode(OpId op, uint32_t num_outputs, OpArgs&& args)
      : Node(num_outputs), op_(op), args_(std::move(args)) {}

  std::string name() const override { return op_name(op_); }

  void release_saved() override {
    // As in PyTorch, only a backward that needs freed tensors is an error: a node that saved
    // nothing (a cast, an add) stays usable. Autocast's cached weight casts rely on it.
    bool saved = saved_output_.defined() || !args_.extra.empty();
    for (auto& s : saved_inputs_) {
      saved = saved || s.defined();
      s.reset();
    }
    saved_output_.reset();
    for (auto& t : args_.extra) t = Tensor();
    released_ = released_ || saved;
  }

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    EMBER_CHECK(!released_, "backward", "trying to backward through the graph a second time (",
                name(),
                "'s saved tensors were freed); pass retain_graph=true to the first backward");
    std::vector<Tensor> result = compute(grads);
    result.resize(inputs_.size());
    for (size_t i = 0; i < result.size(); ++i) {
      Tensor& g = result[i];
      if (!g.defined() || !inputs_[i].needs_grad) {
        g = Tensor();
        continue;
      }
      if (g.dtype() != inputs_[i].dtype || g.device() != inputs_[i].device) {
        g = g.to(inputs_[i].device, inputs_[i].dtype);
      }
      EMBER_ASSERT(g.sizes() == inputs_[i].sizes, name(), " produced a gradient of shape ",
                   shape_str(g.sizes()), " for input ", i, " of shape ",
                   shape_str(inputs_[i].sizes));
    }
    return result;
  }

  void save(std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
    const SavePlan plan = save_plan(op_);
    saved_inputs_.resize(inputs.size());
    for (int i : plan.inputs)
      saved_inputs_[static_cast<size_t>(i)] = SavedTensor(inputs[static_cast<size_t>(i)]);
    // Outputs are saved without their history: a node holding its own output would form a cycle.
    if (plan.output) saved_output_ = SavedTensor(outputs[0].detach());
    for (const Tensor& t : inputs) {
      InputInfo info;
      if (t.defined()) info = InputInfo{t.sizes(), t.dtype(), t.device(), t.requires_grad()};
      inputs_.push_back(std::move(info));
    }
  }

 private:
  const Tensor& in(size_t i) const { return saved_inputs_[i].unpack(op_name(op_)); }
  const Tensor& out() const { return saved_output_.unpack(op_name(op_)); }
  bool needs(size_t i) const { return inputs_[i].needs_grad; }
  const Shape& shape(size_t i) const { return inputs_[i].sizes; }

  std::vector<Tensor> compute(const std::vector<Tensor>& grads) {
    const Tensor& g = grads[0];
    const OpArgs& a = args_;
    switch (op_) {
      case OpId::kAdd:
        return {sum_to(g, shape(0)),
                sum_to(a.alpha.to_double() == 1.0 ? g : g * a.alpha, shape(1))};
      case OpId::kSub:
        return {sum_to(g, shape(0)),
                sum_to(a.alpha.to_double() == 1.0 ? -g : g * -a.alpha.to_double(), shape(1))};
      case OpId::kMul:
        return {needs(0) ? sum_to(g * in(1), shape(0)) : Tensor(),
                needs(1) ? sum_to(g * in(0), shape(1)) : Tensor()};
      case OpId::kDiv:
        return {needs(0) ? sum_to(g / in(1), shape(0)) : Tensor(),
                needs(1) ? sum_to(-g * in(0) / (in(1) * in(1)), shape(1)) : Tensor()};
      case OpId::kPow: {
        const Tensor &x = in(0), &e = in(1);
        Tensor gx, ge;
        if (needs(0)) gx = sum_to(where(eq(e, 0), 0.0, g * e * pow(x, e - 1)), shape(0));
        // d/de x^e = x^e log x, taken as 0 where x == 0 (the limit for e > 0).
        if (needs(1)) ge = sum_to(where(eq(x, 0), 0.0, g * out() * log(x)), shape(1));
        return {gx, ge};
      }
      case OpId::kPowScalar: {
        const double e = a.a;
        if (e == 0.0) return {zeros_like(g)};
        return {g * (pow(in(0), e - 1.0) * e)};  // PyTorch's order: grad * (e * x^(e-1))
      }
      case OpId::kMaximum:
      case OpId::kMinimum: {
        // Ties split the gradient evenly, as in PyTorch.
        const Tensor& x = in(0);
        const Tensor& y = in(1);
        const Tensor wins = op_ == OpId::kMaximum ? gt(x, y) : lt(x, y);
        const Tensor share = wins.to(g.dtype()) + eq(x, y).to(g.dtype()) * 0.5;
        return {needs(0) ? sum_to(g * share, shape(0)) : Tensor(),
                needs(1) ? sum_to(g * (1.0 - share), shape(1)) : Tensor()};
      }
      case OpId::kNeg:
        return {-g};
      case OpId::kAbs:
        return {g * sign_of(in(0))};
      case OpId::kExp:
        return {g * out()};
      case OpId::kLog:
        return {g / in(0)};
      case OpId::kSqrt:
        return {g / (out() * 2.0)};
      case OpId::kRsqrt:
        return {g * pow(out(), 3) * -0.5};
      case OpId::kRelu:
        return {detail::relu_backward(g, out())};
      case OpId::kSigmoid:
        return {g * out() * (1.0 - out())};
      case OpId::kTanh:
        return {g * (1.0 - out() * out())};
      case OpId::kClamp: {
        const Tensor& x = in(0);
        return {g * (ge(x, a.a).to(g.dtype()) * le(x, a.b).to(g.dtype()))};
      }
      case OpId::kWhere: {
        const Tensor& cond = a.extra.at(0);
        return {Tensor(), needs(1) ? sum_to(where(cond, g, 0.0), shape(1)) : Tensor(),
                needs(2) ? sum_to(where(cond, 0.0, g), shape(2)) : Tensor()};
      }
      case OpId::kCast:
      case OpId::kClone:
        return {g};
      case OpId::kReshape:
        return {g.reshape(shape(0))};
      case OpId::kTranspose:
        return {g.transpose(a.dim, a.dim2)};
      case OpId::kPermute: {
        Shape inverse(a.dims.size());
        for (size_t i = 0; i < a.dims.size(); ++i)
          inverse[static_cast<size_t>(a.dims[i])] = static_cast<int64_t>(i);
        return {g.permute(inverse)};
      }
      case OpId::kSlice:
      case OpId::kSelect: {
        Tensor result = zeros(shape(0), g.options());
        NoGradGuard no_grad;
        if (op_ == OpId::kSlice) {
          result.slice(a.dim, a.start, a.start + g.size(a.dim) * a.step, a.step).copy_(g);
        } else {
          result.select(a.dim, a.start).copy_(g);
        }
        return {result};
      }
      case OpId::kExpand:
        return {sum_to(g, shape(0))};
      case OpId::kSum:
        return {expand_reduced(g, shape(0), a.dims, a.keepdim)};
      case OpId::kMean: {
        int64_t n = 1;
        const auto dims =
            detail::wrap_dims(a.dims, static_cast<int64_t>(shape(0).size()), "backward");
        for (int64_t d : dims) n *= shape(0)[static_cast<size_t>(d)];
        return {expand_reduced(g, shape(0), a.dims, a.keepdim) / static_cast<double>(n)};
      }
      case OpId::kMaxAll:
      case OpId::kMinAll: {
        const Tensor hits = eq(in(0), out()).to(g.dtype());
        return {hits * (g / sum(hits))};
      }
      case OpId::kMaxDim:
      case OpId::kMinDim: {
        Tensor indices = a.extra.at(0), gk = g;
        if (!a.keepdim && !shape(0).empty()) {
          indices = indices.unsqueeze(a.dim);
          gk = gk.unsqueeze(a.dim);
        }
        return {scatter_add(zeros(shape(0), g.options()), a.dim, indices, gk)};
      }
      case OpId::kVar: {
        const Tensor& x = in(0);
        int64_t n = 1;
        const auto dims = detail::wrap_dims(a.dims, x.dim(), "backward");
        for (int64_t d : dims) n *= x.size(d);
        const Tensor centered = x - mean(x, a.dims, true);
        return {expand_reduced(g, shape(0), a.dims, a.keepdim) * centered *
                (2.0 / static_cast<double>(std::max<int64_t>(n - a.correction, 0)))};
      }
      case OpId::kNorm: {
        const Tensor& x = in(0);
        const Tensor norm_k = expand_reduced(out(), shape(0), a.dims, a.keepdim);
        const Tensor gk = expand_reduced(g, shape(0), a.dims, a.keepdim);
        const double p = a.a;
        if (std::isinf(p)) {
          const Tensor hits = eq(abs(x), norm_k).to(g.dtype());
          const Tensor count =
              expand_reduced(sum(hits, a.dims, a.keepdim), shape(0), a.dims, a.keepdim);
          return {gk * sign_of(x) * hits / count};
        }
        if (p == 1.0) return {gk * sign_of(x)};
        // x |x|^(p-2) / norm^(p-1); zero where the norm is zero.
        const Tensor scale =
            p == 2.0 ? x / norm_k : x * pow(abs(x), p - 2.0) / pow(norm_k, p - 1.0);
        return {where(eq(norm_k, 0), 0.0, gk * scale)};
      }
      case OpId::kMm:
        return {needs(0) ? mm(g, in(1).t()) : Tensor(), needs(1) ? mm(in(0).t(), g) : Tensor()};
      case OpId::kBmm:
        return {needs(0) ? bmm(g, in(1).transpose(1, 2)) : Tensor(),
                needs(1) ? bmm(in(0).transpose(1, 2), g) : Tensor()};
      case OpId::kAddmm: {
        const double beta = a.a, alpha = a.b;
        return {needs(0) ? sum_to(beta == 1.0 ? g : g * beta, shape(0)) : Tensor(),
                needs(1) ? mm(g, in(2).t()) * alpha : Tensor(),
                needs(2) ? mm(in(1).t(), g) * alpha : Tensor()};
      }
      case OpId::kSoftmax: {
        const Tensor& y = out();
        return {y * (g - sum(g * y, {a.dim}, true))};
      }
      case OpId::kLogSoftmax:
        return {g - exp(out()) * sum(g, {a.dim}, true)};
      case OpId::kCat: {
        std::vector<Tensor> result;
        int64_t offset = 0;
        for (size_t i = 0; i < inputs_.size(); ++i) {
          const int64_t size = shape(i).size() > static_cast<size_t>(a.dim)
                                   ? shape(i)[static_cast<size_t>(a.dim)]
                                   : 0;
          result.push_back(needs(i) ? g.narrow(a.dim, offset, size) : Tensor());
          offset += size;
        }
        return result;
      }
      case OpId::kIndexSelect: {
        // Scatter the rows back; index (1-d) is broadcast along the other dims of g.
        Shape view(static_cast<size_t>(g.dim()), 1);
        view[static_cast<size_t>(a.dim)] = g.size(a.dim);
        const Tensor index = a.extra.at(0).reshape(view).expand(g.sizes());
        return {scatter_add(zeros(shape(0), g.options()), a.dim, index, g), Tensor()};
      }
      case OpId::kGather:
        return {scatter_add(zeros(shape(0), g.options()), a.dim, a.extra.at(0), g), Tensor()};
      case OpId::kScatterAdd:
        return {g, Tensor(), needs(2) ? gather(g, a.dim, a.extra.at(0)) : Tensor()};
      case OpId::kConv2d: {
        const auto grads3 =
            detail::conv2d_backward(g, in(0), in(1), a.conv, {needs(0), needs(1), needs(2)});
        return {grads3[0], grads3[1], grads3[2]};
      }
      case OpId::kBatchNorm: {
        const auto grads3 =
            detail::batch_norm_backward(g, in(0), in(1), a.extra.at(0), a.extra.at(1), a.training,
                                        {needs(0), needs(1), needs(2)});
        return {grads3[0], grads3[1], grads3[2]};
      }
      case OpId::kMaxPool2d:
        return {detail::max_pool2d_backward(g, shape(0), a.extra.at(0), a.pool)};
      case OpId::kAvgPool2d:
        return {detail::avg_pool2d_backward(g, shape(0), a.pool)};
      case OpId::kAdaptiveAvgPool2d:
        return {detail::adaptive_avg_pool2d_backward(g, shape(0), a.pool)};
      case OpId::kCrossEntropy:
        return {detail::cross_entropy_backward(g, in(0), a.extra.at(0), a.extra.at(1), a.dim, a.a),
                Tensor()};
      // attention
      case OpId::kScaledDotProductAttention: {
        const auto grads3 = detail::scaled_dot_product_attention_backward(
            g, in(0), in(1), in(2), out(), a.extra.at(0), a.attention,
            {needs(0), needs(1), needs(2)});
        return {grads3[0], grads3[1], grads3[2]};
      }
      // GPT layers
      case OpId::kGelu:
        return {detail::gelu_backward(g, in(0), a.a != 0.0)};
      case OpId::kLayerNorm: {
        const auto grads3 = detail::layer_norm_backward(
            g, in(0), in(1), a.extra.at(0), a.extra.at(1), a.dims, {needs(0), needs(1), needs(2)});
        return {grads3[0], grads3[1], grads3[2]};
      }
      case OpId::kEmbedding:
        return {Tensor(), detail::embedding_backward(g, a.extra.at(0), shape(1)[0], a.start)};
      // fused layers
      case OpId::kBatchNormRelu:
      case OpId::kBatchNormAddRelu: {
        const auto grads4 = detail::batch_norm_relu_backward(
            g, out(), in(0), in(1), a.extra.at(0), a.extra.at(1), a.training,
            {needs(0), needs(1), needs(2), op_ == OpId::kBatchNormAddRelu && needs(3)});
        return {grads4[0], grads4[1], grads4[2], grads4[3]};
      }
      case OpId::kBiasActivation: {
        EMBER_ASSERT(a.dim == static_cast<int64_t>(Activation::kRelu), "activation ", a.dim);
        const Tensor gm = detail::relu_backward(g, out());
        return {gm, needs(1) ? sum_to(gm, shape(1)) : Tensor()};
      }
      default:
        break;
    }
    EMBER_ASSERT(false, "no backward formula for ", name());
    return {};
  }

  OpId op_;
  OpArgs args_;
  std::vector<SavedTensor> saved_inputs_;
  SavedTensor saved_output_;
  std::vector<InputInfo> inputs_;
  bool released_ = false;
};

void record(OpId op, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
            OpArgs&& args) {
  auto node = std::make_shared<OpNode>(op, static_cast<uint32_t>(outputs.size()), std::move(args));
  node->save(inputs, outputs);
  for (const Tensor& t : inputs) node->add_next_edge(gradient_edge(t));
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    if (!out.defined() || !out.is_floating_point()) continue;
    AutogradMeta& meta = out.ensure_autograd_meta();
    meta.requires_grad = true;
    meta.grad_fn = node;
    meta.output_nr = static_cast<uint32_t>(i);
  }
}

void backward_hook(const Tensor& root, const Tensor& gradient, bool retain_graph,
                   bool create_graph) {
  backward({root}, {gradient}, retain_graph, create_graph);
}

void register_hook(const Tensor& t, std::function<Tensor(const Tensor&)> hook) {
  if (t.is_leaf()) {
    t.ensure_autograd_meta().grad_hooks.push_back(std::move(hook));
  } else {
    t.grad_fn()->add_pre_hook(t.autograd_meta()->output_nr, std::move(hook));
  }
}

void retain_grad(const Tensor& t) {
  std::weak_ptr<AutogradMeta> weak = t.weak_autograd_meta();
  t.grad_fn()->add_retain_grad_hook(t.autograd_meta()->output_nr, [weak](const Tensor& g) {
    if (auto meta = weak.lock()) meta->grad = meta->grad.defined() ? meta->grad + g : g.clone();
    return Tensor();
  });
}

const detail::AutogradHooks kHooks{record, backward_hook, register_hook, retain_grad};

}  // namespace

bool register_autograd() {
  detail::set_autograd_hooks(&kHooks);
  return true;
}

}  // namespace ember::autograd
