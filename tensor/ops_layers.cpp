// Front ends of the layer ops: argument checks, output shapes, autograd recording.
#include <cmath>

#include "detail/autocast_policy.h"
#include "detail/autograd_hooks.h"
#include "detail/layer_backward.h"
#include "detail/op_def.h"
#include "detail/op_utils.h"
#include "layer_ops.h"
#include "ops.h"

namespace ember {

using detail::AutogradScope;
using detail::Conv2dParams;
using detail::OpArgs;
using detail::Pool2dParams;

// --- descriptors --------------------------------------------------------------------------

namespace {
// conv2d without bias, with the parameters a recorded convolution ran with.
Tensor conv2d_with(const Tensor& input, const Tensor& weight, const Conv2dParams& p) {
  return conv2d(input, weight, {}, {p.stride[0], p.stride[1]}, {p.padding[0], p.padding[1]},
                {p.dilation[0], p.dilation[1]}, p.groups);
}
// avg_pool2d with its parameters and output shape decided (its gradient's gradient pools).
Tensor avg_pool2d_with(const Tensor& input, Pool2dParams params, const Shape& shape);
}  // namespace

// OpArgs::conv: the convolution's parameters. Under create_graph the gradients are the
// recorded ops convolution_backward_input/_weight and a sum, differentiable again; otherwise
// one fused kernel call computes them.
std::vector<Tensor> conv2d_backward_formula(const detail::BackwardContext& c, const Tensor& g) {
  const Tensor &x = c.in(0), &w = c.in(1);
  const Conv2dParams& p = c.args().conv;
  if (detail::grad_needed({&g, &x, &w})) {
    return {c.needs(0) ? detail::conv2d_input_grad(g, x, w, p) : Tensor(),
            c.needs(1) ? detail::conv2d_weight_grad(g, x, w, p) : Tensor(),
            c.needs(2) ? g.sum({0, 2, 3}) : Tensor()};
  }
  const auto grads = detail::conv2d_backward(g, x, w, p, {c.needs(0), c.needs(1), c.needs(2)});
  return {grads[0], grads[1], grads[2]};
}
// The input gradient A(g, w) is linear in g and in w: for an incoming u (the input's shape),
// d<u, A>/dg = conv(u, w) and d<u, A>/dw = B(u, g), B the weight gradient. Inputs: g, w.
std::vector<Tensor> conv2d_input_grad_backward(const detail::BackwardContext& c, const Tensor& u) {
  const Conv2dParams& p = c.args().conv;
  return {c.needs(0) ? conv2d_with(u, c.in(1), p) : Tensor(),
          c.needs(1) ? detail::conv2d_weight_grad(c.in(0), u, c.in(1), p) : Tensor()};
}
// The weight gradient B(g, x): for an incoming v (the weight's shape), d<v, B>/dg = conv(x, v)
// and d<v, B>/dx = A(g, v). Inputs: g, x.
std::vector<Tensor> conv2d_weight_grad_backward(const detail::BackwardContext& c, const Tensor& v) {
  const Conv2dParams& p = c.args().conv;
  return {c.needs(0) ? conv2d_with(c.in(1), v, p) : Tensor(),
          c.needs(1) ? detail::conv2d_input_grad(c.in(0), c.in(1), v, p) : Tensor()};
}
// batch_norm's gradients in recorded ops (create_graph), from the statistics' dtype: in
// training the statistics are recomputed from the input (PyTorch's double backward sees their
// dependence on it); in eval the running statistics (save_mean, save_invstd) are constants.
// Dtypes and layout as the kernel's: a gradient of the input in its dtype and format, of the
// weight and bias in the parameters' dtype.
std::array<Tensor, 3> batch_norm_backward_recorded(const Tensor& g, const Tensor& input,
                                                   const Tensor& weight, const OpArgs& a,
                                                   std::array<bool, 3> needs) {
  const DType stat = a.extra.at(1).dtype();
  Shape dims, per_channel(static_cast<size_t>(input.dim()), 1);
  per_channel[1] = input.size(1);
  for (int64_t d = 0; d < input.dim(); ++d)
    if (d != 1) dims.push_back(d);
  const Tensor x = input.to(stat), gy = g.to(stat);
  const detail::Normalized n = a.training
                                   ? detail::normalize_recorded(x, dims, a.a)
                                   : detail::Normalized{(x - a.extra.at(0).view(per_channel)) *
                                                            a.extra.at(1).view(per_channel),
                                                        a.extra.at(1).view(per_channel)};
  const DType param = weight.defined() ? weight.dtype() : input.dtype();
  std::array<Tensor, 3> grads;
  if (needs[0]) {
    Tensor gi = a.training ? detail::normalize_backward_recorded(gy, n, dims) : gy * n.rstd;
    if (weight.defined()) gi = gi * weight.to(stat).view(per_channel);
    grads[0] = gi.to(input.dtype()).contiguous(input.suggest_memory_format());
  }
  if (needs[1] && weight.defined()) grads[1] = sum(gy * n.xhat, dims).to(param);
  if (needs[2]) grads[2] = sum(gy, dims).to(param);
  return grads;
}

// OpArgs::extra: save_mean, save_invstd; training; a: eps. The fused kernel, or recorded ops
// when the backward itself is recorded.
std::vector<Tensor> batch_norm_backward_formula(const detail::BackwardContext& c, const Tensor& g) {
  const OpArgs& a = c.args();
  const std::array<bool, 3> needs{c.needs(0), c.needs(1), c.needs(2)};
  const auto grads = detail::grad_needed({&g, &c.in(0), &c.in(1)})
                         ? batch_norm_backward_recorded(g, c.in(0), c.in(1), a, needs)
                         : detail::batch_norm_backward(g, c.in(0), c.in(1), a.extra.at(0),
                                                       a.extra.at(1), a.training, needs);
  return {grads[0], grads[1], grads[2]};
}
// Inputs: input, weight, bias, residual (undefined without the add); as batch norm's. The
// residual's gradient is g masked by the output's sign.
std::vector<Tensor> batch_norm_relu_backward_formula(const detail::BackwardContext& c,
                                                     const Tensor& g) {
  const OpArgs& a = c.args();
  const bool residual = c.num_inputs() > 3 && c.needs(3);
  if (detail::grad_needed({&g, &c.in(0), &c.in(1)})) {
    const Tensor gm = detail::relu_backward(g, c.out());
    const auto grads =
        batch_norm_backward_recorded(gm, c.in(0), c.in(1), a, {c.needs(0), c.needs(1), c.needs(2)});
    return {grads[0], grads[1], grads[2],
            residual ? gm.contiguous(c.in(0).suggest_memory_format()) : Tensor()};
  }
  const auto grads =
      detail::batch_norm_relu_backward(g, c.out(), c.in(0), c.in(1), a.extra.at(0), a.extra.at(1),
                                       a.training, {c.needs(0), c.needs(1), c.needs(2), residual});
  return {grads[0], grads[1], grads[2], grads[3]};
}
// OpArgs::extra: the indices; pool.
std::vector<Tensor> max_pool2d_backward_formula(const detail::BackwardContext& c, const Tensor& g) {
  return {detail::max_pool2d_backward(g, c.shape(0), c.args().extra.at(0), c.args().pool)};
}
std::vector<Tensor> avg_pool2d_backward_formula(const detail::BackwardContext& c, const Tensor& g) {
  return {detail::avg_pool2d_backward(g, c.shape(0), c.args().pool)};
}
std::vector<Tensor> adaptive_avg_pool2d_backward_formula(const detail::BackwardContext& c,
                                                         const Tensor& g) {
  return {detail::adaptive_avg_pool2d_backward(g, c.shape(0), c.args().pool)};
}
// The pooling gradients are recorded ops, linear in g: max_pool2d's gathers the incoming u at
// the forward's indices (flat positions in each plane), the average pools' pool u again.
std::vector<Tensor> max_pool2d_grad_backward(const detail::BackwardContext& c, const Tensor& u) {
  const Shape& out = c.shape(0);
  const Tensor planes = u.reshape({out[0], out[1], u.size(2) * u.size(3)});
  const Tensor picks = c.args().extra.at(0).reshape({out[0], out[1], out[2] * out[3]});
  return {gather(planes, 2, picks).reshape(out)};
}
std::vector<Tensor> avg_pool2d_grad_backward(const detail::BackwardContext& c, const Tensor& u) {
  return {avg_pool2d_with(u, c.args().pool, c.shape(0))};
}
std::vector<Tensor> adaptive_avg_pool2d_grad_backward(const detail::BackwardContext& c,
                                                      const Tensor& u) {
  return {adaptive_avg_pool2d(u, {c.shape(0)[2], c.shape(0)[3]})};
}
// Inputs: GEMM output, bias; OpArgs::dim: the Activation (ReLU is the one fused).
std::vector<Tensor> bias_activation_backward(const detail::BackwardContext& c, const Tensor& g) {
  EMBER_ASSERT(c.args().dim == static_cast<int64_t>(Activation::kRelu), "activation ",
               c.args().dim);
  const Tensor gm = detail::relu_backward(g, c.out());
  return {gm, c.needs(1) ? detail::sum_to(gm, c.shape(1)) : Tensor()};
}

EMBER_OP(kConv2dOp, detail::define_op("conv2d", "Conv2dBackward", detail::saves({0, 1}, false),
                                      conv2d_backward_formula, detail::CastPolicy::kLowerPrecision,
                                      detail::uses_kernels({EMBER_KERNEL(conv2d_forward),
                                                            EMBER_KERNEL(conv2d_backward)})));
// conv2d's gradients under create_graph (PyTorch's convolution_backward, one op per output).
EMBER_OP(kConvInputGradOp,
         detail::define_op(
             "convolution_backward_input", "ConvolutionBackwardInputBackward",
             detail::saves({0, 1}, false), conv2d_input_grad_backward, detail::kNoAutocast,
             detail::uses_kernels({EMBER_KERNEL(conv2d_forward), EMBER_KERNEL(conv2d_backward)})));
EMBER_OP(kConvWeightGradOp,
         detail::define_op(
             "convolution_backward_weight", "ConvolutionBackwardWeightBackward",
             detail::saves({0, 1}, false), conv2d_weight_grad_backward, detail::kNoAutocast,
             detail::uses_kernels({EMBER_KERNEL(conv2d_forward), EMBER_KERNEL(conv2d_backward)})));
// batch_norm and its fused forms are on no autocast list, as in PyTorch: a bf16/f16 input
// with f32 parameters and statistics, computed in f32, returning the input's dtype.
EMBER_OP(kBatchNormOp,
         detail::define_op("batch_norm", "BatchNormBackward", detail::saves({0, 1}, false),
                           batch_norm_backward_formula, detail::kNoAutocast,
                           detail::uses_kernels({EMBER_KERNEL(batch_norm_forward),
                                                 EMBER_KERNEL(batch_norm_backward)})));
EMBER_OP(kBatchNormReluOp,
         detail::define_op("batch_norm_relu", "BatchNormReluBackward", detail::saves({0, 1}, true),
                           batch_norm_relu_backward_formula, detail::kNoAutocast,
                           detail::uses_kernels({EMBER_KERNEL(batch_norm_relu_forward),
                                                 EMBER_KERNEL(batch_norm_relu_backward)})));
EMBER_OP(kBatchNormAddReluOp,
         detail::define_op("batch_norm_add_relu", "BatchNormAddReluBackward",
                           detail::saves({0, 1}, true), batch_norm_relu_backward_formula,
                           detail::kNoAutocast,
                           detail::uses_kernels({EMBER_KERNEL(batch_norm_relu_forward),
                                                 EMBER_KERNEL(batch_norm_relu_backward)})));
EMBER_OP(kMaxPool2dOp,
         detail::define_op("max_pool2d", "MaxPool2dBackward", detail::saves({}, false),
                           max_pool2d_backward_formula, detail::kNoAutocast,
                           detail::uses_kernels({EMBER_KERNEL(max_pool2d_forward),
                                                 EMBER_KERNEL(max_pool2d_backward)})));
EMBER_OP(kAvgPool2dOp,
         detail::define_op("avg_pool2d", "AvgPool2dBackward", detail::saves({}, false),
                           avg_pool2d_backward_formula, detail::kNoAutocast,
                           detail::uses_kernels({EMBER_KERNEL(avg_pool2d_forward),
                                                 EMBER_KERNEL(avg_pool2d_backward)})));
EMBER_OP(kAdaptiveAvgPool2dOp,
         detail::define_op("adaptive_avg_pool2d", "AdaptiveAvgPool2dBackward",
                           detail::saves({}, false), adaptive_avg_pool2d_backward_formula,
                           detail::kNoAutocast,
                           detail::uses_kernels({EMBER_KERNEL(adaptive_avg_pool2d_forward),
                                                 EMBER_KERNEL(adaptive_avg_pool2d_backward)})));
// The pooling gradients as ops (PyTorch's max_pool2d_with_indices_backward, avg_pool2d_backward,
// _adaptive_avg_pool2d_backward). OpArgs::pool; max_pool2d's: OpArgs::extra, the indices.
EMBER_OP(kMaxPool2dGradOp,
         detail::define_op("max_pool2d_backward", "MaxPool2dBackwardBackward",
                           detail::saves({}, false), max_pool2d_grad_backward, detail::kNoAutocast,
                           detail::uses_kernels({EMBER_KERNEL(max_pool2d_backward),
                                                 EMBER_KERNEL(gather)})));
EMBER_OP(kAvgPool2dGradOp,
         detail::define_op("avg_pool2d_backward", "AvgPool2dBackwardBackward",
                           detail::saves({}, false), avg_pool2d_grad_backward, detail::kNoAutocast,
                           detail::uses_kernels({EMBER_KERNEL(avg_pool2d_backward),
                                                 EMBER_KERNEL(avg_pool2d_forward)})));
EMBER_OP(kAdaptiveAvgPool2dGradOp,
         detail::define_op("adaptive_avg_pool2d_backward", "AdaptiveAvgPool2dBackwardBackward",
                           detail::saves({}, false), adaptive_avg_pool2d_grad_backward,
                           detail::kNoAutocast,
                           detail::uses_kernels({EMBER_KERNEL(adaptive_avg_pool2d_backward),
                                                 EMBER_KERNEL(adaptive_avg_pool2d_forward)})));
// linear's fused epilogue (autocast by linear's rule in linear's front end).
EMBER_OP(kBiasActivationOp,
         detail::define_op("bias_activation", "BiasActivationBackward", detail::saves({}, true),
                           bias_activation_backward, detail::kNoAutocast,
                           detail::uses_kernels({EMBER_KERNEL(bias_activation)})));
EMBER_OP(kLinearOp, detail::define_composite("linear", detail::CastPolicy::kLowerPrecision));

namespace {

std::string pair_str(Pair p) { return detail::str_cat("(", p[0], ", ", p[1], ")"); }

void check_nchw(const Tensor& t, const char* op) {
  detail::check_defined(t, op);
  EMBER_CHECK(t.dim() == 4, op, "expected a 4-d input [N, C, H, W], got shape ",
              shape_str(t.sizes()));
  EMBER_CHECK(t.is_floating_point(), op, "expected a floating input, got ", t.dtype());
}

void check_like(const Tensor& t, const Tensor& input, const char* op, const char* name) {
  if (!t.defined()) return;
  EMBER_CHECK(t.dtype() == input.dtype(), op, name, " has dtype ", t.dtype(), " but input has ",
              input.dtype());
  EMBER_CHECK(t.device() == input.device(), op, name, " is on ", t.device().str(),
              " but input is on ", input.device().str());
}

// PyTorch's output size of a sliding window (ceil_mode drops a last window that would
// start in the right padding).
int64_t window_count(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  const int64_t span = in + 2 * p - d * (k - 1) - 1;
  if (span < 0) return 0;
  int64_t out = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

// PyTorch's rule: a convolution computes in channels_last when its input or its weight
// suggests it, and every tensor it touches is made dense in that format.
MemoryFormat conv_memory_format(const Tensor& input, const Tensor& weight) {
  const bool cl = input.suggest_memory_format() == MemoryFormat::ChannelsLast ||
                  weight.suggest_memory_format() == MemoryFormat::ChannelsLast;
  return cl ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
}

}  // namespace

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, Pair stride,
              Pair padding, Pair dilation, int64_t groups) {
  if (auto out = detail::autocast(kConv2dOp, {&input, &weight, &bias}, [&](const auto& x) {
        return conv2d(x[0], x[1], x[2], stride, padding, dilation, groups);
      }))
    return *out;
  const char* op = "conv2d";
  check_nchw(input, op);
  detail::check_defined(weight, op, "weight");
  EMBER_CHECK(weight.dim() == 4, op, "expected a 4-d weight [O, C/groups, kH, kW], got shape ",
              shape_str(weight.sizes()));
  check_like(weight, input, op, "weight");
  check_like(bias, input, op, "bias");
  EMBER_CHECK(groups > 0, op, "groups must be positive, got ", groups);
  EMBER_CHECK(stride[0] > 0 && stride[1] > 0, op, "stride must be positive, got ",
              pair_str(stride));
  EMBER_CHECK(padding[0] >= 0 && padding[1] >= 0, op, "padding must be non-negative, got ",
              pair_str(padding));
  EMBER_CHECK(dilation[0] > 0 && dilation[1] > 0, op, "dilation must be positive, got ",
              pair_str(dilation));
  const int64_t channels = input.size(1), out_channels = weight.size(0);
  EMBER_CHECK(channels == weight.size(1) * groups, op, "input has ", channels,
              " channels but weight expects ", weight.size(1) * groups, " (input ",
              shape_str(input.sizes()), ", weight ", shape_str(weight.sizes()),
              groups > 1 ? detail::str_cat(", groups ", groups) : "", ")");
  EMBER_CHECK(out_channels % groups == 0, op, "weight has ", out_channels,
              " output channels, not divisible by ", groups, " groups");
  EMBER_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == out_channels), op,
              "bias of shape ", bias.defined() ? shape_str(bias.sizes()) : "", " does not match ",
              out_channels, " output channels");
  const int64_t ho =
      window_count(input.size(2), weight.size(2), stride[0], padding[0], dilation[0], false);
  const int64_t wo =
      window_count(input.size(3), weight.size(3), stride[1], padding[1], dilation[1], false);
  EMBER_CHECK(ho > 0 && wo > 0, op, "input of spatial size ", input.size(2), "x", input.size(3),
              " is too small for kernel ", weight.size(2), "x", weight.size(3), " with padding ",
              pair_str(padding), " and dilation ", pair_str(dilation));

  AutogradScope scope(kConv2dOp, {&input, &weight, &bias});
  Conv2dParams params;
  params.stride[0] = stride[0];
  params.stride[1] = stride[1];
  params.padding[0] = padding[0];
  params.padding[1] = padding[1];
  params.dilation[0] = dilation[0];
  params.dilation[1] = dilation[1];
  params.groups = groups;
  const MemoryFormat format = conv_memory_format(input, weight);
  params.channels_last = format == MemoryFormat::ChannelsLast;
  Tensor out = empty({input.size(0), out_channels, ho, wo}, input.options(), format);
  if (out.numel() > 0) {
    auto kernel = detail::require_kernel(detail::kernels_for(input.device(), op).conv2d_forward,
                                         input.device(), op);
    kernel(out, input.contiguous(format), weight.contiguous(format),
           bias.defined() ? bias.contiguous() : bias, params);
  }
  OpArgs args;
  args.conv = params;
  return scope.finish(out, std::move(args));
}

namespace {

// batch_norm's argument checks, shared by its fused forms (`op` names the caller).
void check_batch_norm(const char* op, const Tensor& input, const Tensor& weight, const Tensor& bias,
                      const Tensor& running_mean, const Tensor& running_var, bool training,
                      double eps) {
  detail::check_defined(input, op);
  EMBER_CHECK(input.dim() >= 2, op, "expected an input [N, C, ...], got shape ",
              shape_str(input.sizes()));
  EMBER_CHECK(input.is_floating_point(), op, "expected a floating input, got ", input.dtype());
  const int64_t n = input.size(0), channels = input.size(1);
  const int64_t spatial = input.dim() > 2 ? input.numel() / std::max<int64_t>(n * channels, 1) : 1;
  // A bf16/f16 input may come with f32 parameters and statistics (mixed precision: autocast
  // leaves batch_norm's f32 weights alone), as PyTorch allows.
  const bool low_input = input.dtype() == kF16 || input.dtype() == kBF16;
  for (const auto& [t, name] : {std::pair{&weight, "weight"},
                                {&bias, "bias"},
                                {&running_mean, "running_mean"},
                                {&running_var, "running_var"}}) {
    if (!(low_input && t->defined() && t->dtype() == kF32)) check_like(*t, input, op, name);
    EMBER_CHECK(!t->defined() || t->device() == input.device(), op, name, " is on ",
                t->device().str(), " but input is on ", input.device().str());
    EMBER_CHECK(!t->defined() || (t->dim() == 1 && t->size(0) == channels), op, name, " of shape ",
                t->defined() ? shape_str(t->sizes()) : "", " does not match ", channels,
                " channels of input ", shape_str(input.sizes()));
  }
  EMBER_CHECK(running_mean.defined() == running_var.defined(), op,
              "running_mean and running_var must be given together");
  EMBER_CHECK(training || running_mean.defined(), op,
              "running_mean and running_var are needed in eval mode");
  EMBER_CHECK(!training || n * spatial > 1, op,
              "expected more than 1 value per channel when training, got input of ", "shape ",
              shape_str(input.sizes()));
  EMBER_CHECK(eps > 0, op, "eps must be positive, got ", eps);
  detail::check_inplace(op, running_mean);
  detail::check_inplace(op, running_var);
}

// batch_norm and its fused forms after the checks: `fused` runs the batch-norm + ReLU kernel
// (adding `residual` when it is defined), else the plain batch-norm kernel.
Tensor batch_norm_forward(const detail::OpDef& id, const char* op, bool fused, const Tensor& input,
                          const Tensor& residual, const Tensor& weight, const Tensor& bias,
                          const Tensor& running_mean, const Tensor& running_var, bool training,
                          double momentum, double eps) {
  AutogradScope scope = fused ? AutogradScope(id, {&input, &weight, &bias, &residual})
                              : AutogradScope(id, {&input, &weight, &bias});
  const int64_t channels = input.size(1);
  const MemoryFormat format = input.suggest_memory_format();
  const Tensor x = detail::batch_norm_rows(input, format);
  const Tensor out4 = empty(input.sizes(), input.options(), format);
  Tensor out = out4.view(x.sizes());
  const DType stat_dtype = input.dtype() == kF16 || input.dtype() == kBF16 ? kF32 : input.dtype();
  Tensor save_mean = empty({channels}, TensorOptions(stat_dtype, input.device()));
  Tensor save_invstd = empty({channels}, TensorOptions(stat_dtype, input.device()));
  if (running_mean.defined() && training) {
    running_mean.storage().bump_version();
    running_var.storage().bump_version();
  }
  if (x.numel() > 0) {
    const auto& table = detail::kernels_for(input.device(), op);
    const Tensor w = weight.defined() ? weight.contiguous() : weight;
    const Tensor b = bias.defined() ? bias.contiguous() : bias;
    if (fused) {
      const Tensor r = residual.defined() ? detail::batch_norm_rows(residual, format) : residual;
      detail::require_kernel(table.batch_norm_relu_forward, input.device(), op)(
          out, save_mean, save_invstd, x, r, w, b, running_mean, running_var, training, momentum,
          eps);
    } else {
      detail::require_kernel(table.batch_norm_forward, input.device(), op)(
          out, save_mean, save_invstd, x, w, b, running_mean, running_var, training, momentum, eps);
    }
  }
  OpArgs args;
  args.training = training;
  args.a = eps;
  if (scope.recording()) args.extra = {save_mean, save_invstd};
  return scope.finish(out4, std::move(args));
}

}  // namespace

Tensor batch_norm(const Tensor& input, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum, double eps) {
  const char* op = "batch_norm";
  check_batch_norm(op, input, weight, bias, running_mean, running_var, training, eps);
  return batch_norm_forward(kBatchNormOp, op, false, input, Tensor(), weight, bias, running_mean,
                            running_var, training, momentum, eps);
}

Tensor batch_norm_relu(const Tensor& input, const Tensor& weight, const Tensor& bias,
                       const Tensor& running_mean, const Tensor& running_var, bool training,
                       double momentum, double eps) {
  const char* op = "batch_norm_relu";
  check_batch_norm(op, input, weight, bias, running_mean, running_var, training, eps);
  return batch_norm_forward(kBatchNormReluOp, op, true, input, Tensor(), weight, bias, running_mean,
                            running_var, training, momentum, eps);
}

Tensor batch_norm_add_relu(const Tensor& input, const Tensor& residual, const Tensor& weight,
                           const Tensor& bias, const Tensor& running_mean,
                           const Tensor& running_var, bool training, double momentum, double eps) {
  const char* op = "batch_norm_add_relu";
  check_batch_norm(op, input, weight, bias, running_mean, running_var, training, eps);
  detail::check_defined(residual, op, "residual");
  EMBER_CHECK(residual.sizes() == input.sizes(), op, "residual of shape ",
              shape_str(residual.sizes()), " does not match input ", shape_str(input.sizes()));
  EMBER_CHECK(residual.device() == input.device(), op, "residual is on ", residual.device().str(),
              " but input is on ", input.device().str());
  // Another dtype promotes in the unfused sum (a bf16 activation plus an f32 shortcut under
  // autocast): that composition is the definition, so it runs as such.
  if (residual.dtype() != input.dtype()) {
    return relu(
        batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps) +
        residual);
  }
  return batch_norm_forward(kBatchNormAddReluOp, op, true, input, residual, weight, bias,
                            running_mean, running_var, training, momentum, eps);
}

namespace {

Pool2dParams pool_params(const Tensor& input, Pair kernel, Pair stride, Pair padding, Pair dilation,
                         const char* op) {
  check_nchw(input, op);
  EMBER_CHECK(kernel[0] > 0 && kernel[1] > 0, op, "kernel size must be positive, got ",
              pair_str(kernel));
  if (stride[0] == 0 && stride[1] == 0) stride = kernel;
  EMBER_CHECK(stride[0] > 0 && stride[1] > 0, op, "stride must be positive, got ",
              pair_str(stride));
  EMBER_CHECK(dilation[0] > 0 && dilation[1] > 0, op, "dilation must be positive, got ",
              pair_str(dilation));
  for (int i = 0; i < 2; ++i) {
    const int64_t effective = (kernel[i] - 1) * dilation[i] + 1;
    EMBER_CHECK(padding[i] >= 0 && padding[i] * 2 <= effective, op, "padding ", pair_str(padding),
                " must be non-negative and at most half of the kernel size ", pair_str(kernel));
  }
  Pool2dParams params;
  for (int i = 0; i < 2; ++i) {
    params.kernel[i] = kernel[i];
    params.stride[i] = stride[i];
    params.padding[i] = padding[i];
    params.dilation[i] = dilation[i];
  }
  return params;
}

Shape pooled_shape(const Tensor& input, const Pool2dParams& p, bool ceil_mode, const char* op) {
  const int64_t ho =
      window_count(input.size(2), p.kernel[0], p.stride[0], p.padding[0], p.dilation[0], ceil_mode);
  const int64_t wo =
      window_count(input.size(3), p.kernel[1], p.stride[1], p.padding[1], p.dilation[1], ceil_mode);
  EMBER_CHECK(ho > 0 && wo > 0, op, "input of spatial size ", input.size(2), "x", input.size(3),
              " is too small for kernel (", p.kernel[0], ", ", p.kernel[1], ")");
  return {input.size(0), input.size(1), ho, wo};
}

// Pooling computes in its input's layout (channels_last kernels for a channels_last input,
// no conversion) and records it in `params` for the backward.
MemoryFormat pool_format(const Tensor& input, Pool2dParams& params) {
  const MemoryFormat format = input.suggest_memory_format();
  params.channels_last = format == MemoryFormat::ChannelsLast;
  return format;
}

}  // namespace

Tensor max_pool2d(const Tensor& input, Pair kernel, Pair stride, Pair padding, Pair dilation,
                  bool ceil_mode) {
  const char* op = "max_pool2d";
  Pool2dParams params = pool_params(input, kernel, stride, padding, dilation, op);
  const Shape shape = pooled_shape(input, params, ceil_mode, op);
  AutogradScope scope(kMaxPool2dOp, {&input});
  const MemoryFormat format = pool_format(input, params);
  Tensor out = empty(shape, input.options(), format);
  Tensor indices = empty(shape, TensorOptions(kI64, input.device()), format);
  if (out.numel() > 0) {
    detail::require_kernel(detail::kernels_for(input.device(), op).max_pool2d_forward,
                           input.device(), op)(out, indices, input.contiguous(format), params);
  }
  OpArgs args;
  args.pool = params;
  if (scope.recording()) args.extra = {indices};
  return scope.finish(out, std::move(args));
}

Tensor avg_pool2d(const Tensor& input, Pair kernel, Pair stride, Pair padding, bool ceil_mode,
                  bool count_include_pad) {
  const char* op = "avg_pool2d";
  Pool2dParams params = pool_params(input, kernel, stride, padding, {1, 1}, op);
  params.count_include_pad = count_include_pad;
  return avg_pool2d_with(input, params, pooled_shape(input, params, ceil_mode, op));
}

namespace {
Tensor avg_pool2d_with(const Tensor& input, Pool2dParams params, const Shape& shape) {
  const char* op = "avg_pool2d";
  AutogradScope scope(kAvgPool2dOp, {&input});
  const MemoryFormat format = pool_format(input, params);
  Tensor out = empty(shape, input.options(), format);
  if (out.numel() > 0) {
    detail::require_kernel(detail::kernels_for(input.device(), op).avg_pool2d_forward,
                           input.device(), op)(out, input.contiguous(format), params);
  }
  OpArgs args;
  args.pool = params;
  return scope.finish(out, std::move(args));
}
}  // namespace

Tensor adaptive_avg_pool2d(const Tensor& input, Pair output_size) {
  const char* op = "adaptive_avg_pool2d";
  check_nchw(input, op);
  EMBER_CHECK(output_size[0] > 0 && output_size[1] > 0, op, "output size must be positive, got ",
              pair_str(output_size));
  EMBER_CHECK(input.size(2) > 0 && input.size(3) > 0, op, "input of shape ",
              shape_str(input.sizes()), " has an empty plane");
  AutogradScope scope(kAdaptiveAvgPool2dOp, {&input});
  Pool2dParams params;
  const MemoryFormat format = pool_format(input, params);
  Tensor out = empty({input.size(0), input.size(1), output_size[0], output_size[1]},
                     input.options(), format);
  if (out.numel() > 0) {
    detail::require_kernel(detail::kernels_for(input.device(), op).adaptive_avg_pool2d_forward,
                           input.device(), op)(out, input.contiguous(format));
  }
  OpArgs args;
  args.pool = params;
  return scope.finish(out, std::move(args));
}

Tensor dropout(const Tensor& input, double p, bool training, Generator* gen) {
  detail::check_defined(input, "dropout");
  EMBER_CHECK(p >= 0.0 && p <= 1.0, "dropout", "probability must be in [0, 1], got ", p);
  if (!training || p == 0.0) return input;
  if (p == 1.0) return input * 0.0;
  // The draw is f32 whatever the input's dtype, so masks agree across dtypes (a 16-bit draw
  // would also round uniforms up to 1 and skew the keep probability).
  const Tensor keep = bernoulli(input.sizes(), 1.0 - p, TensorOptions(kF32, input.device()), gen);
  return input * (keep.to(input.dtype()) / (1.0 - p));
}

namespace {

void check_linear(const char* op, const Tensor& input, const Tensor& weight, const Tensor& bias) {
  detail::check_defined(input, op);
  detail::check_defined(weight, op, "weight");
  EMBER_CHECK(weight.dim() == 2, op, "expected a 2-d weight [out, in], got shape ",
              shape_str(weight.sizes()));
  EMBER_CHECK(input.dim() >= 1 && input.size(-1) == weight.size(1), op, "input has ",
              input.dim() >= 1 ? input.size(-1) : 0, " features but weight expects ",
              weight.size(1), " (input ", shape_str(input.sizes()), ", weight ",
              shape_str(weight.sizes()), ")");
  EMBER_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)), op,
              "bias of shape ", bias.defined() ? shape_str(bias.sizes()) : "", " does not match ",
              weight.size(0), " outputs");
}

// activation(x + bias) over the last dim of x, in one pass (bias may be undefined).
Tensor bias_activation(const Tensor& x, const Tensor& bias, Activation activation) {
  const char* op = "linear";
  AutogradScope scope(kBiasActivationOp, {&x, &bias});
  const Tensor in = x.contiguous();
  Tensor out = empty(in.sizes(), in.options());
  if (out.numel() > 0) {
    detail::require_kernel(detail::kernels_for(in.device(), op).bias_activation, in.device(), op)(
        activation, out, in, bias.defined() ? bias.contiguous() : bias);
  }
  OpArgs args;
  args.dim = static_cast<int64_t>(activation);
  return scope.finish(out, std::move(args));
}

}  // namespace

Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias) {
  if (auto out = detail::autocast(kLinearOp, {&input, &weight, &bias},
                                  [](const auto& x) { return linear(x[0], x[1], x[2]); }))
    return *out;
  check_linear("linear", input, weight, bias);
  if (input.dim() == 2 && bias.defined()) return addmm(bias, input, weight.t());
  if (input.dim() > 2 && bias.defined() && input.is_contiguous() && input.numel() > 0) {
    // [..., in] folds into one [rows, in] GEMM whose epilogue adds the bias (as PyTorch folds
    // a contiguous input), instead of a matmul and a separate pass for + bias.
    Shape out_shape = input.sizes();
    out_shape.back() = weight.size(0);
    return addmm(bias, input.reshape({-1, input.size(-1)}), weight.t()).reshape(out_shape);
  }
  Tensor out = matmul(input, weight.t());
  return bias.defined() ? out + bias : out;
}

Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias,
              Activation activation) {
  if (activation == Activation::kNone) return linear(input, weight, bias);
  if (auto out = detail::autocast(kLinearOp, {&input, &weight, &bias}, [activation](const auto& x) {
        return linear(x[0], x[1], x[2], activation);
      }))
    return *out;
  check_linear("linear", input, weight, bias);
  const Tensor out = matmul(input, weight.t());
  check_like(bias, out, "linear", "bias");  // the epilogue takes one dtype and device
  return bias_activation(out, bias, activation);
}

// --- backward computations ---------------------------------------------------------------

namespace detail {

Tensor batch_norm_rows(const Tensor& t, MemoryFormat format) {
  const int64_t n = t.size(0), channels = t.size(1);
  const int64_t spatial = t.numel() / std::max<int64_t>(n * channels, 1);
  return t.contiguous(format).view({n, channels, spatial});
}

std::array<Tensor, 3> conv2d_backward(const Tensor& grad_out, const Tensor& input,
                                      const Tensor& weight, const Conv2dParams& params,
                                      std::array<bool, 3> needs) {
  const MemoryFormat format =
      params.channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  Tensor gi = needs[0] ? empty(input.sizes(), input.options(), format) : Tensor();
  Tensor gw = needs[1] ? empty(weight.sizes(), weight.options(), format) : Tensor();
  Tensor gb = needs[2] ? empty({weight.size(0)}, weight.options()) : Tensor();
  if (needs[0] || needs[1] || needs[2]) {
    require_kernel(kernels_for(input.device(), "conv2d").conv2d_backward, input.device(), "conv2d")(
        gi, gw, gb, grad_out.contiguous(format), input.contiguous(format),
        weight.contiguous(format), params);
  }
  // Each gradient takes its tensor's format (a no-op unless input and weight differ).
  return {gi.defined() ? gi.contiguous(input.suggest_memory_format()) : gi,
          gw.defined() ? gw.contiguous(weight.suggest_memory_format()) : gw, gb};
}

Tensor conv2d_input_grad(const Tensor& grad_out, const Tensor& input, const Tensor& weight,
                         const Conv2dParams& params) {
  AutogradScope scope(kConvInputGradOp, {&grad_out, &weight});
  const Tensor gi = conv2d_backward(grad_out, input, weight, params, {true, false, false})[0];
  OpArgs args;
  args.conv = params;
  return scope.finish(gi, std::move(args));
}

Tensor conv2d_weight_grad(const Tensor& grad_out, const Tensor& input, const Tensor& weight,
                          const Conv2dParams& params) {
  AutogradScope scope(kConvWeightGradOp, {&grad_out, &input});
  const Tensor gw = conv2d_backward(grad_out, input, weight, params, {false, true, false})[1];
  OpArgs args;
  args.conv = params;
  return scope.finish(gw, std::move(args));
}

std::array<Tensor, 3> batch_norm_backward(const Tensor& grad_out, const Tensor& input,
                                          const Tensor& weight, const Tensor& save_mean,
                                          const Tensor& save_invstd, bool training,
                                          std::array<bool, 3> needs) {
  const int64_t channels = input.size(1);
  const MemoryFormat format = input.suggest_memory_format();
  const Tensor x = batch_norm_rows(input, format);
  const Tensor gi4 = needs[0] ? empty(input.sizes(), input.options(), format) : Tensor();
  Tensor gi = gi4.defined() ? gi4.view(x.sizes()) : gi4;
  Tensor gw = needs[1] && weight.defined() ? empty({channels}, weight.options()) : Tensor();
  // The bias's gradient takes the parameters' dtype (f32 beside a bf16/f16 input under
  // mixed precision; the engine casts it to the bias's dtype if that differs).
  Tensor gb = needs[2] ? empty({channels}, weight.defined() ? weight.options() : input.options())
                       : Tensor();
  require_kernel(kernels_for(input.device(), "batch_norm").batch_norm_backward, input.device(),
                 "batch_norm")(gi, gw, gb, batch_norm_rows(grad_out, format), x, weight, save_mean,
                               save_invstd, training);
  return {gi4, gw, gb};
}

Normalized normalize_recorded(const Tensor& x, const Shape& dims, double eps) {
  const Tensor centered = x - mean(x, dims, true);
  const Tensor rstd = rsqrt(mean(centered * centered, dims, true) + eps);
  return {centered * rstd, rstd};
}

Tensor normalize_backward_recorded(const Tensor& grad_xhat, const Normalized& n,
                                   const Shape& dims) {
  return (grad_xhat - mean(grad_xhat, dims, true) - n.xhat * mean(grad_xhat * n.xhat, dims, true)) *
         n.rstd;
}

namespace {
MemoryFormat grad_format(const Pool2dParams& params) {
  return params.channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
}
}  // namespace

std::array<Tensor, 4> batch_norm_relu_backward(const Tensor& grad_out, const Tensor& output,
                                               const Tensor& input, const Tensor& weight,
                                               const Tensor& save_mean, const Tensor& save_invstd,
                                               bool training, std::array<bool, 4> needs) {
  const int64_t channels = input.size(1);
  const MemoryFormat format = input.suggest_memory_format();
  const Tensor x = batch_norm_rows(input, format);
  auto like_input = [&](bool need) {
    return need ? empty(input.sizes(), input.options(), format) : Tensor();
  };
  const Tensor gi4 = like_input(needs[0]), gr4 = like_input(needs[3]);
  Tensor gw = needs[1] && weight.defined() ? empty({channels}, weight.options()) : Tensor();
  Tensor gb = needs[2] ? empty({channels}, weight.defined() ? weight.options() : input.options())
                       : Tensor();
  auto rows = [&](const Tensor& t) { return t.defined() ? t.view(x.sizes()) : t; };
  require_kernel(kernels_for(input.device(), "batch_norm_relu").batch_norm_relu_backward,
                 input.device(), "batch_norm_relu")(
      rows(gi4), rows(gr4), gw, gb, batch_norm_rows(grad_out, format),
      batch_norm_rows(output, format), x, weight, save_mean, save_invstd, training);
  return {gi4, gw, gb, gr4};
}

Tensor max_pool2d_backward(const Tensor& grad_out, const Shape& input_sizes, const Tensor& indices,
                           const Pool2dParams& params) {
  AutogradScope scope(kMaxPool2dGradOp, {&grad_out});
  const MemoryFormat format = grad_format(params);
  Tensor gi = empty(input_sizes, grad_out.options(), format);
  require_kernel(kernels_for(grad_out.device(), "max_pool2d").max_pool2d_backward,
                 grad_out.device(),
                 "max_pool2d")(gi, grad_out.contiguous(format), indices.contiguous(format), params);
  OpArgs args;
  if (scope.recording()) args.extra = {indices};
  return scope.finish(gi, std::move(args));
}

Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& input_sizes,
                           const Pool2dParams& params) {
  AutogradScope scope(kAvgPool2dGradOp, {&grad_out});
  const MemoryFormat format = grad_format(params);
  Tensor gi = empty(input_sizes, grad_out.options(), format);
  require_kernel(kernels_for(grad_out.device(), "avg_pool2d").avg_pool2d_backward,
                 grad_out.device(), "avg_pool2d")(gi, grad_out.contiguous(format), params);
  OpArgs args;
  args.pool = params;
  return scope.finish(gi, std::move(args));
}

Tensor adaptive_avg_pool2d_backward(const Tensor& grad_out, const Shape& input_sizes,
                                    const Pool2dParams& params) {
  AutogradScope scope(kAdaptiveAvgPool2dGradOp, {&grad_out});
  const MemoryFormat format = grad_format(params);
  Tensor gi = empty(input_sizes, grad_out.options(), format);
  require_kernel(kernels_for(grad_out.device(), "adaptive_avg_pool2d").adaptive_avg_pool2d_backward,
                 grad_out.device(), "adaptive_avg_pool2d")(gi, grad_out.contiguous(format));
  return scope.finish(gi);
}

Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& lse,
                              const Tensor& target, int64_t ignore_index, double smoothing) {
  Tensor gl = empty(logits.sizes(), logits.options());
  require_kernel(kernels_for(logits.device(), "cross_entropy").cross_entropy_backward,
                 logits.device(), "cross_entropy")(gl, grad_loss.contiguous(), logits.contiguous(),
                                                   lse, target, ignore_index, smoothing);
  return gl;
}

}  // namespace detail

}  // namespace ember
