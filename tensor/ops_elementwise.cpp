// Front ends of the factories and the elementwise ops: argument checks, type promotion,
// broadcasting, then one kernel-table call.
#include <cmath>
#include <limits>

#include "detail/autocast_policy.h"
#include "detail/autograd_hooks.h"
#include "detail/dispatch.h"
#include "detail/gelu_math.h"
#include "detail/kernel_table.h"
#include "detail/layer_backward.h"
#include "detail/op_def.h"
#include "detail/op_utils.h"
#include "layer_ops.h"
#include "ops.h"

namespace ember {

using detail::AutogradScope;
using detail::BinaryOp;
using detail::UnaryOp;

// --- factories -------------------------------------------------------------------------

Tensor empty(const Shape& sizes, TensorOptions options) {
  int64_t numel = 1;
  for (int64_t s : sizes) {
    EMBER_CHECK(s >= 0, "empty", "negative size in shape ", shape_str(sizes));
    numel *= s;
  }
  Allocator* allocator = nullptr;
  if (options.pinned_memory) {
    EMBER_CHECK(options.device.is_cpu(), "empty", "pinned memory is host memory, but device ",
                options.device.str(), " was asked for");
    allocator = &pinned_allocator();
  }
  const size_t nbytes = static_cast<size_t>(numel) * element_size(options.dtype);
  return Tensor(Storage(nbytes, options.device, allocator), options.dtype, sizes,
                detail::contiguous_strides(sizes));
}

Tensor full(const Shape& sizes, Scalar value, TensorOptions options) {
  Tensor t = empty(sizes, options);
  t.fill_(value);
  return t;
}
Tensor zeros(const Shape& sizes, TensorOptions options) { return full(sizes, 0, options); }
Tensor ones(const Shape& sizes, TensorOptions options) { return full(sizes, 1, options); }
Tensor empty(const Shape& sizes, TensorOptions options, MemoryFormat format) {
  EMBER_CHECK(format != MemoryFormat::Preserve, "empty",
              "preserve_format needs a tensor to preserve; use empty_like");
  Tensor t = empty(sizes, options);
  if (format == MemoryFormat::Contiguous) return t;
  return Tensor(t.storage(), t.dtype(), sizes, detail::channels_last_strides(sizes, "empty"));
}

Tensor empty_like(const Tensor& t, MemoryFormat format) {
  if (format == MemoryFormat::Preserve) format = t.suggest_memory_format();
  if (format == MemoryFormat::ChannelsLast) detail::check_channels_last(t.sizes(), "empty_like");
  return empty(t.sizes(), t.options(), format);
}
Tensor full_like(const Tensor& t, Scalar value, MemoryFormat format) {
  Tensor out = empty_like(t, format);
  out.fill_(value);
  return out;
}
Tensor zeros_like(const Tensor& t, MemoryFormat format) { return full_like(t, 0, format); }
Tensor ones_like(const Tensor& t, MemoryFormat format) { return full_like(t, 1, format); }

Tensor scalar_tensor(Scalar value, TensorOptions options) { return full({}, value, options); }
Tensor scalar_tensor(Scalar value) { return scalar_tensor(value, value.default_dtype()); }

Tensor arange(Scalar end, TensorOptions options) { return arange(0, end, 1, options); }

Tensor arange(Scalar start, Scalar end, Scalar step, TensorOptions options) {
  const double s = start.to_double(), e = end.to_double(), d = step.to_double();
  EMBER_CHECK(d != 0, "arange", "step must be nonzero");
  EMBER_CHECK(std::isfinite(s) && std::isfinite(e), "arange", "start ", start, " and end ", end,
              " must be finite");
  EMBER_CHECK((d > 0 && e >= s) || (d < 0 && e <= s), "arange", "upper bound ", end, " and step ",
              step, " are inconsistent with start ", start);
  const bool integral = !start.is_floating() && !end.is_floating() && !step.is_floating();
  const int64_t n =
      integral ? (end.to_int() - start.to_int() + step.to_int() - (d > 0 ? 1 : -1)) / step.to_int()
               : static_cast<int64_t>(std::ceil((e - s) / d));
  Tensor host = empty({n}, TensorOptions(options.dtype));
  detail::dispatch_all(options.dtype, "arange", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = host.data_ptr<T>();
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_integral_v<T>) {
        out[i] = static_cast<T>(integral ? start.to_int() + i * step.to_int()
                                         : static_cast<int64_t>(s + static_cast<double>(i) * d));
      } else {
        const double v = integral ? static_cast<double>(start.to_int() + i * step.to_int())
                                  : s + static_cast<double>(i) * d;
        out[i] = static_cast<T>(static_cast<float>(v));
        if constexpr (std::is_same_v<T, double>) out[i] = v;
      }
    }
  });
  return host.to(options.device);
}

Tensor linspace(double start, double end, int64_t steps, TensorOptions options) {
  EMBER_CHECK(steps >= 0, "linspace", "number of steps must be non-negative, got ", steps);
  EMBER_CHECK(is_floating(options.dtype), "linspace", "expected a floating dtype, got ",
              options.dtype);
  Tensor host = empty({steps}, kF64);
  double* out = host.data_ptr<double>();
  const double step = steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0.0;
  // Symmetric from both ends (as PyTorch), so the last value is exactly `end`.
  for (int64_t i = 0; i < steps; ++i) {
    out[i] = i < steps / 2 ? start + step * static_cast<double>(i)
                           : end - step * static_cast<double>(steps - 1 - i);
  }
  return host.to(options.device, options.dtype);
}

template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& sizes, Device device) {
  const Shape shape = sizes.empty() ? Shape{static_cast<int64_t>(values.size())} : sizes;
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  EMBER_CHECK(numel == static_cast<int64_t>(values.size()), "from_vector", "shape ",
              shape_str(shape), " holds ", numel, " elements but ", values.size(),
              " values were given");
  Tensor host = empty(shape, dtype_of<T>);
  std::copy(values.begin(), values.end(), host.data_ptr<T>());
  return host.to(device);
}
template Tensor from_vector(const std::vector<float>&, const Shape&, Device);
template Tensor from_vector(const std::vector<double>&, const Shape&, Device);
template Tensor from_vector(const std::vector<Half>&, const Shape&, Device);
template Tensor from_vector(const std::vector<BFloat16>&, const Shape&, Device);
template Tensor from_vector(const std::vector<int64_t>&, const Shape&, Device);
template Tensor from_vector(const std::vector<int32_t>&, const Shape&, Device);
template Tensor from_vector(const std::vector<uint8_t>&, const Shape&, Device);

template <>
Tensor from_vector(const std::vector<bool>& values, const Shape& sizes, Device device) {
  std::vector<uint8_t> bytes(values.begin(), values.end());
  return from_vector(bytes, sizes, kCPU).to(kBool).to(device);
}

Tensor from_blob(void* data, const Shape& sizes, DType dtype, Device device,
                 std::shared_ptr<void> owner, const Shape& strides) {
  const Shape st = strides.empty() ? detail::contiguous_strides(sizes) : strides;
  EMBER_CHECK(st.size() == sizes.size(), "from_blob", "sizes ", shape_str(sizes), " and strides ",
              shape_str(st), " differ in length");
  int64_t extent = 0;  // elements spanned
  bool empty_view = false;
  for (size_t d = 0; d < sizes.size(); ++d) {
    EMBER_CHECK(sizes[d] >= 0 && st[d] >= 0, "from_blob", "invalid sizes ", shape_str(sizes),
                " or strides ", shape_str(st));
    if (sizes[d] == 0) empty_view = true;
    extent += (sizes[d] - 1) * st[d];
  }
  extent = empty_view ? 0 : extent + 1;
  EMBER_CHECK(data != nullptr || extent == 0, "from_blob", "null data for shape ",
              shape_str(sizes));
  // The DataPtr shares ownership with `owner` (if any) but never frees `data` itself.
  DataPtr ptr(owner, data);
  if (!owner) ptr = DataPtr(data, [](void*) {});
  Storage storage(std::move(ptr), static_cast<size_t>(extent) * element_size(dtype), device);
  return Tensor(std::move(storage), dtype, sizes, st, 0);
}

// --- type promotion --------------------------------------------------------------------

namespace {

int category(DType t) { return t == kBool ? 0 : is_floating(t) ? 2 : 1; }

// PyTorch's rule: dims > 0 beat 0-d tensors beat wrapped numbers, except that a lower
// level of a higher category (say, a float scalar with an int tensor) lifts the category.
struct PromotionLevel {
  bool present = false;
  DType dtype = kBool;
  void add(DType t) {
    dtype = present ? promote_types(dtype, t) : t;
    present = true;
  }
};

PromotionLevel combine(PromotionLevel higher, PromotionLevel lower) {
  if (!higher.present) return lower;
  if (!lower.present || is_floating(higher.dtype)) return higher;
  if (higher.dtype == kBool || is_floating(lower.dtype))
    higher.dtype = promote_types(higher.dtype, lower.dtype);
  return higher;
}

DType result_type_of(std::initializer_list<const Tensor*> tensors) {
  PromotionLevel dims, zero_dim, wrapped;
  for (const Tensor* t : tensors) {
    if (t->is_wrapped_number()) {
      // A floating number (held in f64 or f32) promotes as the default float dtype, f32, as
      // in PyTorch: it never widens a floating tensor, and lifts an integer one to f32.
      wrapped.add(is_floating(t->dtype()) ? kF32 : t->dtype());
    } else {
      (t->dim() > 0 ? dims : zero_dim).add(t->dtype());
    }
  }
  return combine(dims, combine(zero_dim, wrapped)).dtype;
}

// A 0-d "wrapped number" tensor on `device`, for mixing scalars into tensor ops. It holds the
// value exactly (f64, i64 or bool); an op rounds it once, to the dtype it computes in.
Tensor wrap(Scalar value, Device device) {
  Tensor t = scalar_tensor(value, TensorOptions(value.exact_dtype(), device));
  t.set_wrapped_number(true);
  return t;
}

// The same, for an op with `other`: a floating value is held in f64 only when the op computes
// in f64; every narrower op reads it as float (16-bit floats round from there, or multiply in
// float), so f32 holds all they see and spares a conversion.
Tensor wrap(Scalar value, const Tensor& other) {
  if (!value.is_floating() || !other.defined() || other.dtype() == kF64)
    return wrap(value, other.device());
  Tensor t = scalar_tensor(value, TensorOptions(kF32, other.device()));
  t.set_wrapped_number(true);
  return t;
}

bool is_reduced_float(DType t) { return t == kF16 || t == kBF16; }

// Whether a result of dtype `from` may be written into a tensor of dtype `to` in place.
bool can_cast(DType from, DType to) { return category(from) <= category(to); }

// Moves a 0-d CPU operand next to a tensor on another device (as PyTorch allows).
Tensor on_device_of(const Tensor& t, const Tensor& reference) {
  if (t.device() != reference.device() && t.dim() == 0 && t.is_cpu()) {
    Tensor moved = t.to(reference.device());
    moved.set_wrapped_number(t.is_wrapped_number());
    return moved;
  }
  return t;
}

// `input` ready for a kernel writing `out`: cast, broadcast, and copied if it overlaps
// `out` in a different layout.
Tensor prepare_input(const Tensor& input, DType dtype, const Shape& shape, const Tensor* out) {
  Tensor result = input.to(dtype).expand(shape);
  if (out != nullptr && result.storage().is_same(out->storage()) &&
      !(result.data_ptr() == out->data_ptr() && result.strides() == out->strides())) {
    result = result.clone();
  }
  return result;
}

void check_alpha(DType dtype, Scalar alpha, const char* op) {
  EMBER_CHECK(is_floating(dtype) || !alpha.is_floating(), op,
              "for integral inputs, alpha must not be a ", "floating point number (got ", alpha,
              ")");
  EMBER_CHECK(dtype != kBool || alpha.is_bool() || alpha.to_int() == 1, op,
              "for bool inputs, alpha must be a bool (got ", alpha, ")");
}

// --- descriptors --------------------------------------------------------------------------

std::vector<Tensor> add_backward(const detail::BackwardContext& c, const Tensor& g) {
  const Scalar alpha = c.args().alpha;
  return {detail::sum_to(g, c.shape(0)),
          detail::sum_to(alpha.to_double() == 1.0 ? g : g * alpha, c.shape(1))};
}
std::vector<Tensor> sub_backward(const detail::BackwardContext& c, const Tensor& g) {
  const Scalar alpha = c.args().alpha;
  return {detail::sum_to(g, c.shape(0)),
          detail::sum_to(alpha.to_double() == 1.0 ? -g : g * -alpha.to_double(), c.shape(1))};
}
std::vector<Tensor> mul_backward(const detail::BackwardContext& c, const Tensor& g) {
  return {c.needs(0) ? detail::sum_to(g * c.in(1), c.shape(0)) : Tensor(),
          c.needs(1) ? detail::sum_to(g * c.in(0), c.shape(1)) : Tensor()};
}
std::vector<Tensor> div_backward(const detail::BackwardContext& c, const Tensor& g) {
  return {c.needs(0) ? detail::sum_to(g / c.in(1), c.shape(0)) : Tensor(),
          c.needs(1) ? detail::sum_to(-g * c.in(0) / (c.in(1) * c.in(1)), c.shape(1)) : Tensor()};
}
std::vector<Tensor> pow_backward(const detail::BackwardContext& c, const Tensor& g) {
  const Tensor &x = c.in(0), &e = c.in(1);
  Tensor gx, ge;
  if (c.needs(0)) gx = detail::sum_to(where(eq(e, 0), 0.0, g * e * pow(x, e - 1)), c.shape(0));
  // d/de x^e = x^e log x, taken as 0 where x == 0 (the limit for e > 0).
  if (c.needs(1)) ge = detail::sum_to(where(eq(x, 0), 0.0, g * c.out() * log(x)), c.shape(1));
  return {gx, ge};
}
// Ties split the gradient evenly, as in PyTorch.
std::vector<Tensor> extremum_backward(const detail::BackwardContext& c, const Tensor& g,
                                      bool is_max) {
  const Tensor& x = c.in(0);
  const Tensor& y = c.in(1);
  const Tensor wins = is_max ? gt(x, y) : lt(x, y);
  const Tensor share = wins.to(g.dtype()) + eq(x, y).to(g.dtype()) * 0.5;
  return {c.needs(0) ? detail::sum_to(g * share, c.shape(0)) : Tensor(),
          c.needs(1) ? detail::sum_to(g * (1.0 - share), c.shape(1)) : Tensor()};
}
std::vector<Tensor> maximum_backward(const detail::BackwardContext& c, const Tensor& g) {
  return extremum_backward(c, g, true);
}
std::vector<Tensor> minimum_backward(const detail::BackwardContext& c, const Tensor& g) {
  return extremum_backward(c, g, false);
}
// OpArgs::a: the exponent.
std::vector<Tensor> pow_scalar_backward(const detail::BackwardContext& c, const Tensor& g) {
  const double e = c.args().a;
  if (e == 0.0) return {zeros_like(g)};
  return {g * (pow(c.in(0), e - 1.0) * e)};  // PyTorch's order: grad * (e * x^(e-1))
}
std::vector<Tensor> neg_backward(const detail::BackwardContext&, const Tensor& g) { return {-g}; }
std::vector<Tensor> abs_backward(const detail::BackwardContext& c, const Tensor& g) {
  return {g * detail::sign_of(c.in(0))};
}
std::vector<Tensor> exp_backward(const detail::BackwardContext& c, const Tensor& g) {
  return {g * c.out()};
}
std::vector<Tensor> log_backward(const detail::BackwardContext& c, const Tensor& g) {
  return {g / c.in(0)};
}
std::vector<Tensor> sqrt_backward(const detail::BackwardContext& c, const Tensor& g) {
  return {g / (c.out() * 2.0)};
}
std::vector<Tensor> rsqrt_backward(const detail::BackwardContext& c, const Tensor& g) {
  return {g * pow(c.out(), 3) * -0.5};
}
std::vector<Tensor> relu_backward_formula(const detail::BackwardContext& c, const Tensor& g) {
  return {detail::relu_backward(g, c.out())};
}
std::vector<Tensor> sigmoid_backward(const detail::BackwardContext& c, const Tensor& g) {
  return {g * c.out() * (1.0 - c.out())};
}
std::vector<Tensor> tanh_backward(const detail::BackwardContext& c, const Tensor& g) {
  return {g * (1.0 - c.out() * c.out())};
}
// OpArgs::a, b: the bounds.
std::vector<Tensor> clamp_backward(const detail::BackwardContext& c, const Tensor& g) {
  const Tensor& x = c.in(0);
  return {g * (ge(x, c.args().a).to(g.dtype()) * le(x, c.args().b).to(g.dtype()))};
}
// OpArgs::extra: the condition.
std::vector<Tensor> where_backward(const detail::BackwardContext& c, const Tensor& g) {
  const Tensor& cond = c.args().extra.at(0);
  return {Tensor(), c.needs(1) ? detail::sum_to(where(cond, g, 0.0), c.shape(1)) : Tensor(),
          c.needs(2) ? detail::sum_to(where(cond, 0.0, g), c.shape(2)) : Tensor()};
}
// OpArgs::a: the GeluApproximate.
std::vector<Tensor> gelu_backward_formula(const detail::BackwardContext& c, const Tensor& g) {
  return {detail::gelu_backward(g, c.in(0), detail::gelu_approximate_of(c.args().a))};
}
// gelu''(x) in recorded ops (PyTorch's gelu_double_backward). Exact: phi(x) (2 - x^2), phi the
// normal density. Tanh form, gelu = x (1 + tanh(v)) / 2 with v = b (x + k x^3):
// sech^2(v) (h (1 - x tanh(v) h) + 3 k b x^2), h = dv/dx = b (1 + 3 k x^2); sech^2(v) is
// 4 sigmoid(2v) sigmoid(-2v), which keeps its digits where tanh(v) nears +-1.
Tensor gelu_second_derivative(const Tensor& x, GeluApproximate approximate) {
  const Tensor x2 = x * x;
  if (approximate == GeluApproximate::kNone) {
    return exp(x2 * -0.5) * detail::kGeluPdfScale * (2.0 - x2);
  }
  constexpr double b = detail::kGeluTanhBeta, k = detail::kGeluTanhKappa;
  const Tensor v = (x + x2 * x * k) * b;
  const Tensor sech2 = sigmoid(v * 2.0) * sigmoid(v * -2.0) * 4.0;
  const Tensor h = (x2 * (3 * k) + 1.0) * b;
  return sech2 * (h * (1.0 - x * tanh(v) * h) + x2 * (3 * k * b));
}
// The gradient of gelu_backward(g, x) = g * gelu'(x), recorded again (any order).
// OpArgs::alpha: the GeluApproximate.
std::vector<Tensor> gelu_backward_backward(const detail::BackwardContext& c, const Tensor& u) {
  const GeluApproximate approximate = detail::gelu_approximate_of(c.args().alpha.to_double());
  const Tensor& g = c.in(0);
  const Tensor& x = c.in(1);
  return {c.needs(0) ? detail::gelu_backward(u, x, approximate) : Tensor(),
          c.needs(1) ? u * g * gelu_second_derivative(x, approximate) : Tensor()};
}

EMBER_OP(kAddOp,
         detail::define_op("add", "AddBackward", detail::saves({}, false), add_backward,
                           detail::kNoAutocast, detail::uses_kernels({EMBER_KERNEL(binary)})));
EMBER_OP(kSubOp,
         detail::define_op("sub", "SubBackward", detail::saves({}, false), sub_backward,
                           detail::kNoAutocast, detail::uses_kernels({EMBER_KERNEL(binary)})));
EMBER_OP(kMulOp,
         detail::define_op("mul", "MulBackward", detail::saves({0, 1}, false), mul_backward,
                           detail::kNoAutocast,
                           detail::uses_kernels({EMBER_KERNEL(binary), EMBER_KERNEL(copy)})));
EMBER_OP(kDivOp,
         detail::define_op("div", "DivBackward", detail::saves({0, 1}, false), div_backward,
                           detail::kNoAutocast,
                           detail::uses_kernels({EMBER_KERNEL(binary), EMBER_KERNEL(copy)})));
EMBER_OP(kPowOp, detail::define_op("pow", "PowBackward", detail::saves({0, 1}, true), pow_backward,
                                   detail::CastPolicy::kFloat32,
                                   detail::uses_kernels({EMBER_KERNEL(binary)})));
EMBER_OP(kMaximumOp, detail::define_op("maximum", "MaximumBackward", detail::saves({0, 1}, false),
                                       maximum_backward, detail::kNoAutocast,
                                       detail::uses_kernels({EMBER_KERNEL(binary)})));
EMBER_OP(kMinimumOp, detail::define_op("minimum", "MinimumBackward", detail::saves({0, 1}, false),
                                       minimum_backward, detail::kNoAutocast,
                                       detail::uses_kernels({EMBER_KERNEL(binary)})));
// pow(tensor, scalar): autocast by pow's rule (kPowOp) in its front end.
EMBER_OP(kPowScalarOp,
         detail::define_op("pow.Scalar", "PowScalarBackward", detail::saves({0}, false),
                           pow_scalar_backward, detail::kNoAutocast,
                           detail::uses_kernels({EMBER_KERNEL(unary)})));
EMBER_OP(kNegOp,
         detail::define_op("neg", "NegBackward", detail::saves({}, false), neg_backward,
                           detail::kNoAutocast, detail::uses_kernels({EMBER_KERNEL(unary)})));
EMBER_OP(kAbsOp,
         detail::define_op("abs", "AbsBackward", detail::saves({0}, false), abs_backward,
                           detail::kNoAutocast, detail::uses_kernels({EMBER_KERNEL(unary)})));
EMBER_OP(kExpOp, detail::define_op("exp", "ExpBackward", detail::saves({}, true), exp_backward,
                                   detail::CastPolicy::kFloat32,
                                   detail::uses_kernels({EMBER_KERNEL(unary)})));
EMBER_OP(kLogOp, detail::define_op("log", "LogBackward", detail::saves({0}, false), log_backward,
                                   detail::CastPolicy::kFloat32,
                                   detail::uses_kernels({EMBER_KERNEL(unary)})));
EMBER_OP(kSqrtOp,
         detail::define_op("sqrt", "SqrtBackward", detail::saves({}, true), sqrt_backward,
                           detail::kNoAutocast, detail::uses_kernels({EMBER_KERNEL(unary)})));
EMBER_OP(kRsqrtOp, detail::define_op("rsqrt", "RsqrtBackward", detail::saves({}, true),
                                     rsqrt_backward, detail::CastPolicy::kFloat32,
                                     detail::uses_kernels({EMBER_KERNEL(unary)})));
EMBER_OP(kReluOp,
         detail::define_op("relu", "ReluBackward", detail::saves({}, true), relu_backward_formula,
                           detail::kNoAutocast, detail::uses_kernels({EMBER_KERNEL(unary)})));
EMBER_OP(kSigmoidOp,
         detail::define_op("sigmoid", "SigmoidBackward", detail::saves({}, true), sigmoid_backward,
                           detail::kNoAutocast, detail::uses_kernels({EMBER_KERNEL(unary)})));
EMBER_OP(kTanhOp,
         detail::define_op("tanh", "TanhBackward", detail::saves({}, true), tanh_backward,
                           detail::kNoAutocast, detail::uses_kernels({EMBER_KERNEL(unary)})));
EMBER_OP(kClampOp,
         detail::define_op("clamp", "ClampBackward", detail::saves({0}, false), clamp_backward,
                           detail::kNoAutocast, detail::uses_kernels({EMBER_KERNEL(unary)})));
EMBER_OP(kWhereOp,
         detail::define_op("where", "WhereBackward", detail::saves({}, false), where_backward,
                           detail::kNoAutocast, detail::uses_kernels({EMBER_KERNEL(where)})));
// GPT layers (gelu is on no autocast list, as in PyTorch).
EMBER_OP(kGeluOp,
         detail::define_op("gelu", "GeluBackward", detail::saves({0}, false), gelu_backward_formula,
                           detail::kNoAutocast, detail::uses_kernels({EMBER_KERNEL(unary)})));
// gelu's gradient as an op of its own (PyTorch's gelu_backward): the fused kernel, whose own
// gradient is recorded, so create_graph through gelu gives second derivatives and beyond.
EMBER_OP(kGeluBackwardOp,
         detail::define_op("gelu_backward", "GeluBackwardBackward", detail::saves({0, 1}, false),
                           gelu_backward_backward, detail::kNoAutocast,
                           detail::uses_kernels({EMBER_KERNEL(binary)})));

// The descriptor of a binary kernel op (comparisons, with no differentiable input, and relu's
// backward kernel, never recorded, name add). Every op is a case and there is no default, so a
// BinaryOp added without one does not compile (-Wswitch, an error under -Werror).
const detail::OpDef& grad_op(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
      return kAddOp;
    case BinaryOp::kSub:
      return kSubOp;
    case BinaryOp::kMul:
      return kMulOp;
    case BinaryOp::kDiv:
      return kDivOp;
    case BinaryOp::kPow:
      return kPowOp;
    case BinaryOp::kMaximum:
      return kMaximumOp;
    case BinaryOp::kMinimum:
      return kMinimumOp;
    case BinaryOp::kGeluBackward:
      return kGeluBackwardOp;
    case BinaryOp::kReluBackward:
    case BinaryOp::kEq:
    case BinaryOp::kNe:
    case BinaryOp::kLt:
    case BinaryOp::kLe:
    case BinaryOp::kGt:
    case BinaryOp::kGe:
      return kAddOp;
  }
  EMBER_ASSERT(false, "grad_op: BinaryOp ", static_cast<int>(op), " out of range");
  return kAddOp;
}

// As above: every UnaryOp is a case, none is a default.
const detail::OpDef& grad_op(UnaryOp op) {
  switch (op) {
    case UnaryOp::kNeg:
      return kNegOp;
    case UnaryOp::kAbs:
      return kAbsOp;
    case UnaryOp::kExp:
      return kExpOp;
    case UnaryOp::kLog:
      return kLogOp;
    case UnaryOp::kSqrt:
      return kSqrtOp;
    case UnaryOp::kRsqrt:
      return kRsqrtOp;
    case UnaryOp::kRelu:
      return kReluOp;
    case UnaryOp::kSigmoid:
      return kSigmoidOp;
    case UnaryOp::kTanh:
      return kTanhOp;
    case UnaryOp::kPowScalar:
      return kPowScalarOp;
    case UnaryOp::kClamp:
      return kClampOp;
    case UnaryOp::kGelu:
      return kGeluOp;
  }
  EMBER_ASSERT(false, "grad_op: UnaryOp ", static_cast<int>(op), " out of range");
  return kNegOp;
}

// The shared path of every binary op; writes into *inplace when given.
Tensor binary(BinaryOp op, const char* name, const Tensor& a_in, const Tensor& b_in,
              Scalar alpha = 1, Tensor* inplace = nullptr) {
  detail::check_defined(a_in, name, "self");
  detail::check_defined(b_in, name, "other");
  if (inplace != nullptr) detail::check_inplace(name, *inplace, {&b_in});
  const bool differentiable = !detail::is_comparison(op);
  AutogradScope scope(grad_op(op),
                      {differentiable ? &a_in : nullptr, differentiable ? &b_in : nullptr});
  const Tensor a = on_device_of(a_in, b_in), b = on_device_of(b_in, a_in);
  detail::check_same_device({&a, &b}, name);
  DType compute = result_type_of({&a, &b});
  if ((op == BinaryOp::kDiv) && !is_floating(compute)) compute = kF32;
  if (op == BinaryOp::kSub) {
    EMBER_CHECK(compute != kBool, name,
                "subtraction of bool tensors is not supported; use logical ops");
  }
  if (op == BinaryOp::kAdd || op == BinaryOp::kSub) check_alpha(compute, alpha, name);
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), name);
  const DType out_dtype = detail::is_comparison(op) ? kBool : compute;

  Tensor out;
  if (inplace != nullptr) {
    EMBER_CHECK(inplace->sizes() == shape, name, "in-place output of shape ",
                shape_str(inplace->sizes()), " cannot hold the broadcast result of shape ",
                shape_str(shape));
    EMBER_CHECK(can_cast(out_dtype, inplace->dtype()), name, "result type ", out_dtype,
                " can't be cast to the in-place output's dtype ", inplace->dtype());
    out = inplace->dtype() == out_dtype ? *inplace
                                        : empty(shape, TensorOptions(out_dtype, a.device()));
  } else {
    out = empty(shape, TensorOptions(out_dtype, a.device()),
                detail::result_memory_format({&a, &b}, shape));
  }
  // f16/bf16 multiplication by a 0-d operand and division by one read it at float precision
  // and compute in float (PyTorch's opmath kernels: x * 0.1 multiplies by 0.1f, x / 0.3 by
  // 1 / 0.3f); every other op rounds the scalar to the tensor's dtype first, as PyTorch does.
  const Tensor* number = nullptr;
  if (is_reduced_float(compute) && op == BinaryOp::kMul)
    number = b.dim() == 0 ? &b : a.is_wrapped_number() ? &a : nullptr;
  if (is_reduced_float(compute) && op == BinaryOp::kDiv && b.dim() == 0) number = &b;
  if (out.numel() > 0 && number != nullptr) {
    const auto& kernels = detail::kernels_for(out.device(), name);
    const auto binary_kernel = detail::require_kernel(kernels.binary, out.device(), name);
    const TensorOptions f32(kF32, out.device());
    const Tensor x = prepare_input(number == &b ? a : b, kF32, shape, nullptr);
    Tensor factor = number->to(kF32);
    if (op == BinaryOp::kDiv) {
      const Tensor quotient = empty({}, f32);
      binary_kernel(BinaryOp::kDiv, quotient, scalar_tensor(1.0, f32), factor, 1);
      factor = quotient;
    }
    const Tensor product = empty(shape, f32);
    binary_kernel(BinaryOp::kMul, product, x, factor.expand(shape), 1);
    out.storage().bump_version();
    detail::require_kernel(kernels.copy, out.device(), name)(out, product);
  } else if (out.numel() > 0) {
    const Tensor x = prepare_input(a, compute, shape, &out),
                 y = prepare_input(b, compute, shape, &out);
    out.storage().bump_version();
    detail::require_kernel(detail::kernels_for(out.device(), name).binary, out.device(), name)(
        op, out, x, y, alpha);
  }
  if (inplace != nullptr) {
    if (!out.is_same(*inplace)) inplace->copy_(out);
    return *inplace;
  }
  detail::OpArgs args;
  args.alpha = alpha;
  return scope.finish(out, std::move(args));
}

enum class UnaryKind { kSameType, kFloatResult, kNoBool };

Tensor unary(UnaryOp op, const char* name, const Tensor& t, UnaryKind kind, double p0 = 0,
             double p1 = 0, std::optional<DType> dtype = std::nullopt, Tensor* inplace = nullptr) {
  detail::check_defined(t, name);
  if (inplace != nullptr) detail::check_inplace(name, *inplace);
  AutogradScope scope(grad_op(op), {&t});
  DType compute = dtype.value_or(t.dtype());
  if (kind == UnaryKind::kFloatResult && !is_floating(compute)) compute = kF32;
  EMBER_CHECK(kind != UnaryKind::kNoBool || compute != kBool, name,
              "not supported for bool tensors");
  Tensor out;
  if (inplace != nullptr) {
    EMBER_CHECK(can_cast(compute, inplace->dtype()), name, "result type ", compute,
                " can't be cast to the in-place output's dtype ", inplace->dtype());
    out = inplace->dtype() == compute ? *inplace
                                      : empty(t.sizes(), TensorOptions(compute, t.device()));
  } else {
    out = empty(t.sizes(), TensorOptions(compute, t.device()),
                detail::result_memory_format({&t}, t.sizes()));
  }
  if (out.numel() > 0) {
    const Tensor x = prepare_input(t, compute, t.sizes(), &out);
    out.storage().bump_version();
    detail::require_kernel(detail::kernels_for(out.device(), name).unary, out.device(), name)(
        op, out, x, p0, p1);
  }
  if (inplace != nullptr) {
    if (!out.is_same(*inplace)) inplace->copy_(out);
    return *inplace;
  }
  detail::OpArgs args;
  args.a = p0;
  args.b = p1;
  return scope.finish(out, std::move(args));
}

}  // namespace

DType result_type(const Tensor& a, const Tensor& b) { return result_type_of({&a, &b}); }
DType result_type(const Tensor& a, Scalar b) {
  const Tensor w = wrap(b, kCPU);
  return result_type_of({&a, &w});
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape result(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    EMBER_CHECK(da == db || da == 1 || db == 1, op, "shapes ", shape_str(a), " and ", shape_str(b),
                " cannot broadcast");
    result[i] = da == 1 ? db : da;
  }
  return result;
}

// --- elementwise -----------------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) {
  return binary(BinaryOp::kAdd, "add", a, b, alpha);
}
Tensor add(const Tensor& a, Scalar b) { return binary(BinaryOp::kAdd, "add", a, wrap(b, a)); }
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha) {
  return binary(BinaryOp::kSub, "sub", a, b, alpha);
}
Tensor sub(const Tensor& a, Scalar b) { return binary(BinaryOp::kSub, "sub", a, wrap(b, a)); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kMul, "mul", a, b); }
Tensor mul(const Tensor& a, Scalar b) { return binary(BinaryOp::kMul, "mul", a, wrap(b, a)); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kDiv, "div", a, b); }
Tensor div(const Tensor& a, Scalar b) { return binary(BinaryOp::kDiv, "div", a, wrap(b, a)); }
Tensor maximum(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::kMaximum, "maximum", a, b);
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::kMinimum, "minimum", a, b);
}

Tensor pow(const Tensor& base, const Tensor& exponent) {
  if (auto out = detail::autocast(kPowOp, {&base, &exponent},
                                  [](const auto& x) { return pow(x[0], x[1]); }))
    return *out;
  return binary(BinaryOp::kPow, "pow", base, exponent);
}

namespace {
Tensor pow_scalar(const Tensor& base, Scalar exponent, Tensor* inplace) {
  detail::check_defined(base, "pow");
  const DType dtype = result_type(base, exponent);
  EMBER_CHECK(is_floating(dtype) || exponent.to_int() >= 0, "pow",
              "integers to negative integer powers are not allowed (exponent ", exponent, ")");
  EMBER_CHECK(dtype != kBool, "pow", "not supported for bool tensors");
  return unary(UnaryOp::kPowScalar, "pow", base, UnaryKind::kSameType, exponent.to_double(), 0,
               dtype, inplace);
}
}  // namespace

Tensor pow(const Tensor& base, Scalar exponent) {
  if (auto out =
          detail::autocast(kPowOp, {&base}, [&](const auto& x) { return pow(x[0], exponent); }))
    return *out;
  return pow_scalar(base, exponent, nullptr);
}

Tensor neg(const Tensor& t) { return unary(UnaryOp::kNeg, "neg", t, UnaryKind::kNoBool); }
Tensor abs(const Tensor& t) { return unary(UnaryOp::kAbs, "abs", t, UnaryKind::kNoBool); }
Tensor exp(const Tensor& t) {
  if (auto out = detail::autocast(kExpOp, {&t}, [](const auto& x) { return exp(x[0]); }))
    return *out;
  return unary(UnaryOp::kExp, "exp", t, UnaryKind::kFloatResult);
}
Tensor log(const Tensor& t) {
  if (auto out = detail::autocast(kLogOp, {&t}, [](const auto& x) { return log(x[0]); }))
    return *out;
  return unary(UnaryOp::kLog, "log", t, UnaryKind::kFloatResult);
}
Tensor sqrt(const Tensor& t) { return unary(UnaryOp::kSqrt, "sqrt", t, UnaryKind::kFloatResult); }
Tensor rsqrt(const Tensor& t) {
  if (auto out = detail::autocast(kRsqrtOp, {&t}, [](const auto& x) { return rsqrt(x[0]); }))
    return *out;
  return unary(UnaryOp::kRsqrt, "rsqrt", t, UnaryKind::kFloatResult);
}
Tensor relu(const Tensor& t) { return unary(UnaryOp::kRelu, "relu", t, UnaryKind::kNoBool); }
Tensor sigmoid(const Tensor& t) {
  return unary(UnaryOp::kSigmoid, "sigmoid", t, UnaryKind::kFloatResult);
}
Tensor tanh(const Tensor& t) { return unary(UnaryOp::kTanh, "tanh", t, UnaryKind::kFloatResult); }

Tensor gelu(const Tensor& input, GeluApproximate approximate) {
  detail::check_defined(input, "gelu");
  EMBER_CHECK(input.is_floating_point(), "gelu", "expected a floating input, got ", input.dtype());
  return unary(UnaryOp::kGelu, "gelu", input, UnaryKind::kSameType,
               static_cast<double>(approximate));
}

namespace {
Tensor clamp_impl(const Tensor& t, std::optional<Scalar> min, std::optional<Scalar> max,
                  Tensor* inplace) {
  detail::check_defined(t, "clamp");
  EMBER_CHECK(min || max, "clamp", "at least one of min and max must be given");
  const Tensor lo_wrapped = wrap(min.value_or(0), kCPU), hi_wrapped = wrap(max.value_or(0), kCPU);
  const DType dtype = result_type_of({&t, min ? &lo_wrapped : &t, max ? &hi_wrapped : &t});
  EMBER_CHECK(dtype != kBool, "clamp", "not supported for bool tensors");
  const double lo = min ? min->to_double() : -std::numeric_limits<double>::infinity();
  const double hi = max ? max->to_double() : std::numeric_limits<double>::infinity();
  return unary(UnaryOp::kClamp, "clamp", t, UnaryKind::kSameType, lo, hi, dtype, inplace);
}
}  // namespace

Tensor clamp(const Tensor& t, std::optional<Scalar> min, std::optional<Scalar> max) {
  return clamp_impl(t, min, max, nullptr);
}

Tensor where(const Tensor& cond_in, const Tensor& a_in, const Tensor& b_in) {
  detail::check_defined(cond_in, "where", "condition");
  EMBER_CHECK(cond_in.dtype() == kBool, "where", "condition must be a bool tensor, got ",
              cond_in.dtype());
  AutogradScope scope(kWhereOp, {&cond_in, &a_in, &b_in});
  const Tensor a = on_device_of(a_in, cond_in), b = on_device_of(b_in, cond_in);
  const Tensor cond = on_device_of(cond_in, a);
  detail::check_same_device({&cond, &a, &b}, "where");
  const DType dtype = result_type_of({&a, &b});
  const Shape shape =
      broadcast_shapes(broadcast_shapes(cond.sizes(), a.sizes(), "where"), b.sizes(), "where");
  Tensor out = empty(shape, TensorOptions(dtype, cond.device()));
  if (out.numel() > 0) {
    detail::require_kernel(detail::kernels_for(out.device(), "where").where, out.device(), "where")(
        out, cond.expand(shape), a.to(dtype).expand(shape), b.to(dtype).expand(shape));
  }
  detail::OpArgs args;
  if (scope.recording()) args.extra = {cond};
  return scope.finish(out, std::move(args));
}
Tensor where(const Tensor& cond, const Tensor& a, Scalar b) { return where(cond, a, wrap(b, a)); }
Tensor where(const Tensor& cond, Scalar a, const Tensor& b) { return where(cond, wrap(a, b), b); }

Tensor eq(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kEq, "eq", a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kNe, "ne", a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kLt, "lt", a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kLe, "le", a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kGt, "gt", a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kGe, "ge", a, b); }
Tensor eq(const Tensor& a, Scalar b) { return eq(a, wrap(b, a)); }
Tensor ne(const Tensor& a, Scalar b) { return ne(a, wrap(b, a)); }
Tensor lt(const Tensor& a, Scalar b) { return lt(a, wrap(b, a)); }
Tensor le(const Tensor& a, Scalar b) { return le(a, wrap(b, a)); }
Tensor gt(const Tensor& a, Scalar b) { return gt(a, wrap(b, a)); }
Tensor ge(const Tensor& a, Scalar b) { return ge(a, wrap(b, a)); }

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  detail::check_defined(a, "allclose", "self");
  detail::check_defined(b, "allclose", "other");
  if (a.sizes() != b.sizes()) return false;
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == y[i]) continue;  // covers equal infinities
    if (!(std::abs(x[i] - y[i]) <= atol + rtol * std::abs(y[i]))) return false;
  }
  return true;
}

bool equal(const Tensor& a, const Tensor& b) {
  detail::check_defined(a, "equal", "self");
  detail::check_defined(b, "equal", "other");
  return a.sizes() == b.sizes() && a.to_vector<double>() == b.to_vector<double>();
}

namespace detail {

Tensor relu_backward(const Tensor& grad, const Tensor& output) {
  // Recording (create_graph) takes the composite form, which has a backward of its own.
  if (grad_needed({&grad, &output})) return grad * gt(output, 0).to(grad.dtype());
  return binary(BinaryOp::kReluBackward, "relu_backward", grad, output);
}

Tensor gelu_backward(const Tensor& grad, const Tensor& input, GeluApproximate approximate) {
  return binary(BinaryOp::kGeluBackward, "gelu_backward", grad, input,
                static_cast<double>(approximate));
}

}  // namespace detail

// --- Tensor methods and operators ------------------------------------------------------

Tensor& Tensor::add_(const Tensor& other, Scalar alpha) {
  binary(BinaryOp::kAdd, "add_", *this, other, alpha, this);
  return *this;
}
Tensor& Tensor::add_(Scalar other) { return add_(wrap(other, *this)); }
Tensor& Tensor::sub_(const Tensor& other, Scalar alpha) {
  binary(BinaryOp::kSub, "sub_", *this, other, alpha, this);
  return *this;
}
Tensor& Tensor::sub_(Scalar other) { return sub_(wrap(other, *this)); }
Tensor& Tensor::mul_(const Tensor& other) {
  binary(BinaryOp::kMul, "mul_", *this, other, 1, this);
  return *this;
}
Tensor& Tensor::mul_(Scalar other) { return mul_(wrap(other, *this)); }
Tensor& Tensor::div_(const Tensor& other) {
  binary(BinaryOp::kDiv, "div_", *this, other, 1, this);
  return *this;
}
Tensor& Tensor::div_(Scalar other) { return div_(wrap(other, *this)); }
Tensor& Tensor::maximum_(const Tensor& other) {
  binary(BinaryOp::kMaximum, "maximum_", *this, other, 1, this);
  return *this;
}
Tensor& Tensor::minimum_(const Tensor& other) {
  binary(BinaryOp::kMinimum, "minimum_", *this, other, 1, this);
  return *this;
}
Tensor& Tensor::pow_(Scalar exponent) {
  pow_scalar(*this, exponent, this);
  return *this;
}
Tensor& Tensor::neg_() {
  unary(UnaryOp::kNeg, "neg_", *this, UnaryKind::kNoBool, 0, 0, {}, this);
  return *this;
}
Tensor& Tensor::abs_() {
  unary(UnaryOp::kAbs, "abs_", *this, UnaryKind::kNoBool, 0, 0, {}, this);
  return *this;
}
Tensor& Tensor::exp_() {
  unary(UnaryOp::kExp, "exp_", *this, UnaryKind::kFloatResult, 0, 0, {}, this);
  return *this;
}
Tensor& Tensor::log_() {
  unary(UnaryOp::kLog, "log_", *this, UnaryKind::kFloatResult, 0, 0, {}, this);
  return *this;
}
Tensor& Tensor::sqrt_() {
  unary(UnaryOp::kSqrt, "sqrt_", *this, UnaryKind::kFloatResult, 0, 0, {}, this);
  return *this;
}
Tensor& Tensor::rsqrt_() {
  unary(UnaryOp::kRsqrt, "rsqrt_", *this, UnaryKind::kFloatResult, 0, 0, {}, this);
  return *this;
}
Tensor& Tensor::relu_() {
  unary(UnaryOp::kRelu, "relu_", *this, UnaryKind::kNoBool, 0, 0, {}, this);
  return *this;
}
Tensor& Tensor::sigmoid_() {
  unary(UnaryOp::kSigmoid, "sigmoid_", *this, UnaryKind::kFloatResult, 0, 0, {}, this);
  return *this;
}
Tensor& Tensor::tanh_() {
  unary(UnaryOp::kTanh, "tanh_", *this, UnaryKind::kFloatResult, 0, 0, {}, this);
  return *this;
}
Tensor& Tensor::clamp_(std::optional<Scalar> min, std::optional<Scalar> max) {
  clamp_impl(*this, min, max, this);
  return *this;
}

Tensor Tensor::add(const Tensor& other, Scalar alpha) const {
  return ember::add(*this, other, alpha);
}
Tensor Tensor::sub(const Tensor& other, Scalar alpha) const {
  return ember::sub(*this, other, alpha);
}
Tensor Tensor::mul(const Tensor& other) const { return ember::mul(*this, other); }
Tensor Tensor::div(const Tensor& other) const { return ember::div(*this, other); }
Tensor Tensor::pow(Scalar exponent) const { return ember::pow(*this, exponent); }
Tensor Tensor::neg() const { return ember::neg(*this); }
Tensor Tensor::abs() const { return ember::abs(*this); }
Tensor Tensor::exp() const { return ember::exp(*this); }
Tensor Tensor::log() const { return ember::log(*this); }
Tensor Tensor::sqrt() const { return ember::sqrt(*this); }
Tensor Tensor::rsqrt() const { return ember::rsqrt(*this); }
Tensor Tensor::relu() const { return ember::relu(*this); }
Tensor Tensor::sigmoid() const { return ember::sigmoid(*this); }
Tensor Tensor::tanh() const { return ember::tanh(*this); }
Tensor Tensor::clamp(std::optional<Scalar> min, std::optional<Scalar> max) const {
  return ember::clamp(*this, min, max);
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, Scalar b) { return add(a, b); }
Tensor operator-(const Tensor& a, Scalar b) { return sub(a, b); }
Tensor operator*(const Tensor& a, Scalar b) { return mul(a, b); }
Tensor operator/(const Tensor& a, Scalar b) { return div(a, b); }
Tensor operator+(Scalar a, const Tensor& b) { return add(wrap(a, b), b); }
Tensor operator-(Scalar a, const Tensor& b) { return sub(wrap(a, b), b); }
Tensor operator*(Scalar a, const Tensor& b) { return mul(wrap(a, b), b); }
Tensor operator/(Scalar a, const Tensor& b) { return div(wrap(a, b), b); }
Tensor operator-(const Tensor& a) { return neg(a); }
Tensor& operator+=(Tensor& a, const Tensor& b) { return a.add_(b); }
Tensor& operator-=(Tensor& a, const Tensor& b) { return a.sub_(b); }
Tensor& operator*=(Tensor& a, const Tensor& b) { return a.mul_(b); }
Tensor& operator/=(Tensor& a, const Tensor& b) { return a.div_(b); }
Tensor& operator+=(Tensor& a, Scalar b) { return a.add_(b); }
Tensor& operator-=(Tensor& a, Scalar b) { return a.sub_(b); }
Tensor& operator*=(Tensor& a, Scalar b) { return a.mul_(b); }
Tensor& operator/=(Tensor& a, Scalar b) { return a.div_(b); }

}  // namespace ember
