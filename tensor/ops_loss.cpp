// Front ends of the losses (layer_ops.h): argument checks, then either the fused
// cross-entropy kernel (class-index targets without class weights, the common case) or a
// composition of differentiable ops that follows torch.nn.functional's formula term by term,
// so every case runs on every device and has a gradient.
#include <optional>

#include "detail/autocast_policy.h"
#include "detail/autograd_hooks.h"
#include "detail/layer_backward.h"
#include "detail/op_def.h"
#include "detail/op_utils.h"
#include "layer_ops.h"
#include "ops.h"

namespace ember {

using detail::AutogradScope;
using detail::OpArgs;

namespace {

// --- descriptors --------------------------------------------------------------------------

// The fused cross entropy's gradient for logits [M, C] in recorded ops, for a backward that is
// itself recorded (create_graph): g * (softmax(logits) - (1 - s) onehot(target) - s / C), 0 in
// the rows of ignored targets (PyTorch's log_softmax and nll_loss gradients, composed).
Tensor recorded_cross_entropy_backward(const Tensor& g, const Tensor& logits, const Tensor& target,
                                       int64_t ignore_index, double smoothing) {
  const int64_t classes = logits.size(1);
  // The target's one-hot rows by comparison (the front end checked the range: no sync here).
  const Tensor picked =
      eq(target.unsqueeze(1), arange(classes, TensorOptions(kI64, logits.device())))
          .to(logits.dtype());
  Tensor d = softmax(logits, 1) - picked * (1.0 - smoothing);
  if (smoothing > 0.0) d = d - smoothing / static_cast<double>(classes);
  return where(eq(target, ignore_index).unsqueeze(1), 0.0, d * g.unsqueeze(1));
}

// OpArgs::extra: lse, target; dim: ignore_index; a: label smoothing.
std::vector<Tensor> cross_entropy_backward_formula(const detail::BackwardContext& c,
                                                   const Tensor& g) {
  const OpArgs& a = c.args();
  const Tensor& logits = c.in(0);
  if (detail::grad_needed({&g, &logits})) {
    return {recorded_cross_entropy_backward(g, logits, a.extra.at(1), a.dim, a.a), Tensor()};
  }
  return {detail::cross_entropy_backward(g, logits, a.extra.at(0), a.extra.at(1), a.dim, a.a),
          Tensor()};
}

// Every loss runs in f32 under autocast; only the fused cross entropy is a primitive.
EMBER_OP(kCrossEntropyOp,
         detail::define_op("cross_entropy", "CrossEntropyBackward", detail::saves({0}, false),
                           cross_entropy_backward_formula, detail::CastPolicy::kFloat32,
                           detail::uses_kernels({EMBER_KERNEL(cross_entropy_forward),
                                                 EMBER_KERNEL(cross_entropy_backward)})));
EMBER_OP(kNllLossOp, detail::define_composite("nll_loss", detail::CastPolicy::kFloat32));
EMBER_OP(kMseLossOp, detail::define_composite("mse_loss", detail::CastPolicy::kFloat32));
EMBER_OP(kL1LossOp, detail::define_composite("l1_loss", detail::CastPolicy::kFloat32));
EMBER_OP(kSmoothL1LossOp, detail::define_composite("smooth_l1_loss", detail::CastPolicy::kFloat32));
EMBER_OP(kBinaryCrossEntropyWithLogitsOp,
         detail::define_composite("binary_cross_entropy_with_logits",
                                  detail::CastPolicy::kFloat32));

Tensor reduce_loss(const Tensor& per_sample, Reduction reduction, const Tensor& divisor = {}) {
  switch (reduction) {
    case Reduction::kNone:
      return per_sample;
    case Reduction::kSum:
      return sum(per_sample);
    case Reduction::kMean:
      return divisor.defined() ? sum(per_sample) / divisor : mean(per_sample);
  }
  return per_sample;
}

// Scores are [C] (unbatched) or [N, C, d1, ...]: the class dim is 0 or 1.
int64_t class_dim(const Tensor& scores) { return scores.dim() == 1 ? 0 : 1; }

void check_scores(const Tensor& scores, const char* op) {
  detail::check_defined(scores, op);
  EMBER_CHECK(scores.dim() >= 1, op,
              "expected input [N, C], [N, C, d1, ...] or [C], got a 0-dim tensor");
  EMBER_CHECK(scores.is_floating_point(), op, "expected a floating input, got ", scores.dtype());
}

void check_class_weight(const Tensor& weight, const Tensor& scores, const char* op) {
  if (!weight.defined()) return;
  const int64_t classes = scores.size(class_dim(scores));
  EMBER_CHECK(weight.dim() == 1 && weight.size(0) == classes, op, "weight of shape ",
              shape_str(weight.sizes()), " does not match the ", classes,
              " classes of input of shape ", shape_str(scores.sizes()), " (expected [", classes,
              "])");
  EMBER_CHECK(weight.dtype() == scores.dtype(), op, "weight has dtype ", weight.dtype(),
              " but input has ", scores.dtype());
  detail::check_same_device({&scores, &weight}, op);
}

// Class-index targets: i64, the input's shape without the class dim, each value in [0, C)
// or equal to ignore_index.
void check_class_targets(const Tensor& scores, const Tensor& target, int64_t ignore_index,
                         const char* op) {
  Shape expected = scores.sizes();
  expected.erase(expected.begin() + class_dim(scores));
  EMBER_CHECK(target.sizes() == expected, op, "target of shape ", shape_str(target.sizes()),
              " does not match input of shape ", shape_str(scores.sizes()),
              ": expected class indices of shape ", shape_str(expected),
              " or class probabilities of the input's shape");
  EMBER_CHECK(target.dtype() == kI64, op, "class-index target must be i64, got ", target.dtype());
  detail::check_same_device({&scores, &target}, op);
  if (target.numel() == 0) return;
  const Tensor kept = where(eq(target, ignore_index), 0, target);
  const int64_t lo = min(kept).item<int64_t>(), hi = max(kept).item<int64_t>();
  const int64_t classes = scores.size(class_dim(scores));
  EMBER_CHECK(lo >= 0 && hi < classes, op, "target ", lo < 0 ? lo : hi, " is out of range for ",
              classes, " classes (ignore_index ", ignore_index, ")");
}

// weight [C] viewed to broadcast along the class dim of scores.
Tensor class_view(const Tensor& weight, const Tensor& scores) {
  if (scores.dim() == 1) return weight;
  Shape shape(static_cast<size_t>(scores.dim()), 1);
  shape[1] = weight.size(0);
  return weight.view(shape);
}

// Per-sample loss of log-probabilities against valid class-index targets, composed of
// differentiable ops as PyTorch's nll_loss plus its label-smoothing term:
// (1 - s) * (-w[t] * logp[t]) + (s / C) * (-sum_c w[c] * logp[c]), 0 where ignored. Also
// returns the per-sample weights w[t] (0 where ignored), the kMean divisor's terms.
std::pair<Tensor, Tensor> composed_nll(const Tensor& logp, const Tensor& target,
                                       const Tensor& weight, int64_t ignore_index,
                                       double smoothing) {
  const int64_t cd = class_dim(logp);
  const Tensor ignored = eq(target, ignore_index);
  const Tensor safe = where(ignored, 0, target);
  const Tensor picked = gather(logp, cd, safe.unsqueeze(cd)).squeeze(cd);
  Tensor loss, sample_weight;
  if (weight.defined()) {
    const Tensor w = index_select(weight, 0, safe.flatten()).reshape(target.sizes());
    loss = -(w * picked);
    sample_weight = where(ignored, 0.0, w);
  } else {
    loss = -picked;
    sample_weight = eq(ignored, false).to(logp.dtype());
  }
  if (smoothing > 0.0) {
    const Tensor smooth =
        weight.defined() ? -sum(logp * class_view(weight, logp), {cd}) : -sum(logp, {cd});
    const auto classes = static_cast<double>(logp.size(cd));
    loss = loss * (1.0 - smoothing) + smooth * (smoothing / classes);
  }
  return {where(ignored, 0.0, loss), sample_weight};
}

// The fused kernel's per-sample loss for logits [M, C] and targets [M].
Tensor fused_cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                           double smoothing) {
  const char* op = "cross_entropy";
  AutogradScope scope(kCrossEntropyOp, {&logits});
  const int64_t n = logits.size(0);
  Tensor loss = empty({n}, logits.options());
  Tensor lse = empty({n}, logits.options());
  if (n > 0) {
    detail::require_kernel(detail::kernels_for(logits.device(), op).cross_entropy_forward,
                           logits.device(), op)(loss, lse, logits.contiguous(), target.contiguous(),
                                                ignore_index, smoothing);
  }
  OpArgs args;
  args.a = smoothing;
  args.dim = ignore_index;
  if (scope.recording()) args.extra = {lse, target};
  return scope.finish(loss, std::move(args));
}

// Cross-entropy against class probabilities (target shaped like the logits).
Tensor soft_cross_entropy(const Tensor& logits, const Tensor& target,
                          const CrossEntropyOptions& o) {
  const char* op = "cross_entropy";
  EMBER_CHECK(target.is_floating_point(), op,
              "class-probability target (shaped like the input) must be floating, got ",
              target.dtype());
  EMBER_CHECK(o.ignore_index < 0, op,
              "ignore_index is not supported with class-probability targets, got ignore_index ",
              o.ignore_index);
  detail::check_same_device({&logits, &target}, op);
  const int64_t cd = class_dim(logits);
  const int64_t classes = logits.size(cd);
  const Tensor logp = log_softmax(logits, cd);
  const double s = o.label_smoothing;
  const Tensor p = s > 0.0 ? target * (1.0 - s) + s / static_cast<double>(classes) : target;
  Tensor terms = logp * p;
  if (o.weight.defined()) terms = terms * class_view(o.weight, logits);
  switch (o.reduction) {
    case Reduction::kNone:
      return -sum(terms, {cd});
    case Reduction::kSum:
      return -sum(terms);
    case Reduction::kMean: {
      int64_t samples = 1;
      for (int64_t d = 0; d < logits.dim(); ++d) samples *= d == cd ? 1 : logits.size(d);
      return -sum(terms) / static_cast<double>(samples);
    }
  }
  return terms;
}

// input and target of one shape, on one device, input floating.
void check_pointwise(const Tensor& input, const Tensor& target, const char* op) {
  detail::check_defined(input, op);
  detail::check_defined(target, op, "target");
  EMBER_CHECK(input.is_floating_point(), op, "expected a floating input, got ", input.dtype());
  EMBER_CHECK(input.sizes() == target.sizes(), op, "input of shape ", shape_str(input.sizes()),
              " and target of shape ", shape_str(target.sizes()),
              " differ (PyTorch would broadcast them; ember asks for equal shapes)");
  detail::check_same_device({&input, &target}, op);
}

// A weight that must broadcast to the input's shape without growing it.
void check_broadcasts_to(const Tensor& weight, const Tensor& input, const char* op,
                         const char* name) {
  if (!weight.defined()) return;
  detail::check_same_device({&input, &weight}, op);
  EMBER_CHECK(weight.is_floating_point(), op, name, " must be floating, got ", weight.dtype());
  bool fits = weight.dim() <= input.dim();
  for (int64_t i = 1; fits && i <= weight.dim(); ++i) {
    fits = weight.size(-i) == 1 || weight.size(-i) == input.size(-i);
  }
  EMBER_CHECK(fits, op, name, " of shape ", shape_str(weight.sizes()),
              " does not broadcast to input of shape ", shape_str(input.sizes()));
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& o) {
  if (auto out =
          detail::autocast(kCrossEntropyOp, {&logits, &target, &o.weight}, [&](const auto& x) {
            CrossEntropyOptions cast = o;
            cast.weight = x[2];
            return cross_entropy(x[0], x[1], cast);
          }))
    return *out;
  const char* op = "cross_entropy";
  check_scores(logits, op);
  detail::check_defined(target, op, "target");
  check_class_weight(o.weight, logits, op);
  EMBER_CHECK(o.label_smoothing >= 0.0 && o.label_smoothing <= 1.0, op,
              "label_smoothing must be in [0, 1], got ", o.label_smoothing);
  if (target.sizes() == logits.sizes()) return soft_cross_entropy(logits, target, o);
  check_class_targets(logits, target, o.ignore_index, op);

  if (o.weight.defined()) {
    const auto [loss, sample_weight] = composed_nll(log_softmax(logits, class_dim(logits)), target,
                                                    o.weight, o.ignore_index, o.label_smoothing);
    return reduce_loss(loss, o.reduction,
                       o.reduction == Reduction::kMean ? sum(sample_weight) : Tensor());
  }
  // The fused kernel takes rows of C logits: move the class dim last.
  const int64_t classes = logits.size(class_dim(logits));
  Tensor rows = logits.dim() == 1 ? logits.unsqueeze(0) : logits;
  if (rows.dim() > 2) {
    Shape order = {0};
    for (int64_t d = 2; d < rows.dim(); ++d) order.push_back(d);
    order.push_back(1);
    rows = rows.permute(order);
  }
  rows = rows.reshape({-1, classes});
  const Tensor per_sample =
      fused_cross_entropy(rows, target.reshape({-1}), o.ignore_index, o.label_smoothing)
          .reshape(target.sizes());
  const Tensor kept = o.reduction == Reduction::kMean
                          ? sum(ne(target, o.ignore_index)).to(logits.dtype())
                          : Tensor();
  return reduce_loss(per_sample, o.reduction, kept);
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const NLLLossOptions& o) {
  if (auto out = detail::autocast(kNllLossOp, {&log_probs, &target, &o.weight}, [&](const auto& x) {
        NLLLossOptions cast = o;
        cast.weight = x[2];
        return nll_loss(x[0], x[1], cast);
      }))
    return *out;
  const char* op = "nll_loss";
  check_scores(log_probs, op);
  detail::check_defined(target, op, "target");
  check_class_weight(o.weight, log_probs, op);
  check_class_targets(log_probs, target, o.ignore_index, op);
  const auto [loss, sample_weight] = composed_nll(log_probs, target, o.weight, o.ignore_index, 0.0);
  return reduce_loss(loss, o.reduction,
                     o.reduction == Reduction::kMean ? sum(sample_weight) : Tensor());
}

Tensor mse_loss(const Tensor& input, const Tensor& target, const LossOptions& o) {
  if (auto out = detail::autocast(kMseLossOp, {&input, &target},
                                  [&](const auto& x) { return mse_loss(x[0], x[1], o); }))
    return *out;
  check_pointwise(input, target, "mse_loss");
  const Tensor diff = input - target;
  return reduce_loss(diff * diff, o.reduction);
}

Tensor l1_loss(const Tensor& input, const Tensor& target, const LossOptions& o) {
  if (auto out = detail::autocast(kL1LossOp, {&input, &target},
                                  [&](const auto& x) { return l1_loss(x[0], x[1], o); }))
    return *out;
  check_pointwise(input, target, "l1_loss");
  return reduce_loss(abs(input - target), o.reduction);
}

Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, const SmoothL1LossOptions& o) {
  if (auto out = detail::autocast(kSmoothL1LossOp, {&input, &target},
                                  [&](const auto& x) { return smooth_l1_loss(x[0], x[1], o); }))
    return *out;
  const char* op = "smooth_l1_loss";
  check_pointwise(input, target, op);
  EMBER_CHECK(o.beta >= 0.0, op, "beta must be >= 0, got ", o.beta);
  const Tensor z = abs(input - target);
  if (o.beta == 0.0) return reduce_loss(z, o.reduction);
  return reduce_loss(where(lt(z, o.beta), z * 0.5 * z / o.beta, z - 0.5 * o.beta), o.reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        const BCEWithLogitsOptions& o) {
  if (auto out = detail::autocast(kBinaryCrossEntropyWithLogitsOp,
                                  {&input, &target, &o.weight, &o.pos_weight}, [&](const auto& x) {
                                    BCEWithLogitsOptions cast = o;
                                    cast.weight = x[2];
                                    cast.pos_weight = x[3];
                                    return binary_cross_entropy_with_logits(x[0], x[1], cast);
                                  }))
    return *out;
  const char* op = "binary_cross_entropy_with_logits";
  check_pointwise(input, target, op);
  EMBER_CHECK(target.is_floating_point(), op, "target must be floating, got ", target.dtype());
  check_broadcasts_to(o.weight, input, op, "weight");
  check_broadcasts_to(o.pos_weight, input, op, "pos_weight");
  const Tensor max_val = clamp(-input, 0, std::nullopt);
  const Tensor log_term = log(exp(-max_val) + exp(-input - max_val));
  Tensor loss;
  if (o.pos_weight.defined()) {
    const Tensor log_weight = (o.pos_weight - 1) * target + 1;
    loss = (1 - target) * input + log_weight * (log_term + max_val);
  } else {
    loss = (1 - target) * input + max_val + log_term;
  }
  if (o.weight.defined()) loss = loss * o.weight;
  return reduce_loss(loss, o.reduction);
}

}  // namespace ember
