// Autocast: the per-thread state, the op policy table, and the weight-cast cache.
#include "autocast.h"

#include <array>

#include "detail/autocast_policy.h"
#include "error.h"
#include "grad_mode.h"

namespace ember {

namespace detail {
namespace {

using enum CastPolicy;

// THE AUTOCAST OP LISTS. One row per autocast-aware op; the op's front end calls
// detail::autocast() with its AutocastOp first thing. Ops not listed run in whatever dtype
// their inputs have (relu, gelu, embedding, pooling, mean, max, dropout, view ops, ...), and
// elementwise ops with mixed inputs (add, mul, where, ...) promote to the widest by ember's
// ordinary type promotion, as they do in PyTorch.
//
// The lists are PyTorch's CUDA lists (torch.amp docs, aten/src/ATen/autocast_mode.cpp),
// applied to the CPU as well. PyTorch's own CPU lists are shorter: on the CPU it keeps
// softmax, log_softmax, exp, log, pow, rsqrt, sum and norm in the input's dtype. ember's CPU
// autocast deliberately matches the CUDA one there, so a model gives the same dtypes on both
// devices and the numerically sensitive ops stay in f32 everywhere. (Both PyTorch lists
// agree on conv/linear/matmul in the low dtype and on the losses in f32.)
//
// batch_norm is on no list, as in PyTorch: it takes a bf16/f16 input with f32 weight, bias
// and running statistics, computes its statistics in f32 (or wider) and returns the input's
// dtype, as cuDNN's batch norm under autocast does. Its fused forms (batch_norm_relu,
// batch_norm_add_relu) follow the same rule; linear with a fused activation is kLinear.
constexpr AutocastRule kRules[] = {
    // Low precision (bf16 or f16): the tensor-core ops.
    {AutocastOp::kConv2d, "conv2d", kLowerPrecision},
    {AutocastOp::kLinear, "linear", kLowerPrecision},
    {AutocastOp::kMatmul, "matmul", kLowerPrecision},
    {AutocastOp::kMm, "mm", kLowerPrecision},
    {AutocastOp::kBmm, "bmm", kLowerPrecision},
    {AutocastOp::kAddmm, "addmm", kLowerPrecision},
    // f32: softmax, pointwise math that overflows or loses precision in 16 bits, sums and
    // norms, and every loss.
    {AutocastOp::kSoftmax, "softmax", kFloat32},
    {AutocastOp::kLogSoftmax, "log_softmax", kFloat32},
    {AutocastOp::kExp, "exp", kFloat32},
    {AutocastOp::kLog, "log", kFloat32},
    {AutocastOp::kPow, "pow", kFloat32},
    {AutocastOp::kRsqrt, "rsqrt", kFloat32},
    {AutocastOp::kSum, "sum", kFloat32},
    {AutocastOp::kNorm, "norm", kFloat32},
    {AutocastOp::kCrossEntropy, "cross_entropy", kFloat32},
    {AutocastOp::kNllLoss, "nll_loss", kFloat32},
    {AutocastOp::kMseLoss, "mse_loss", kFloat32},
    {AutocastOp::kL1Loss, "l1_loss", kFloat32},
    {AutocastOp::kSmoothL1Loss, "smooth_l1_loss", kFloat32},
    {AutocastOp::kBinaryCrossEntropyWithLogits, "binary_cross_entropy_with_logits", kFloat32},
    // Promote to the widest floating input.
    {AutocastOp::kCat, "cat", kPromote},
    {AutocastOp::kStack, "stack", kPromote},
    {AutocastOp::kScatterAdd, "scatter_add", kPromote},
    // Attention: low precision, as on PyTorch's CUDA list (its kernels accumulate in f32).
    {AutocastOp::kScaledDotProductAttention, "scaled_dot_product_attention", kLowerPrecision},
    // GPT layers: layer_norm in f32 (PyTorch's CUDA list; gelu and embedding are on none).
    {AutocastOp::kLayerNorm, "layer_norm", kFloat32},
};

constexpr bool rules_in_order() {
  for (size_t i = 0; i < std::size(kRules); ++i) {
    if (static_cast<size_t>(kRules[i].op) != i) return false;
  }
  return true;
}
static_assert(rules_in_order(), "kRules must list the AutocastOps in declaration order");

// A cast of a leaf that requires grad, kept while the outermost guard lives.
struct CacheEntry {
  Tensor leaf;
  // The leaf's memory and storage version when cast: an in-place update (an optimizer step)
  // or new data (set_data) recasts.
  const void* data = nullptr;
  uint64_t version = 0;
  bool recorded = false;  // made with grad mode on (has a backward to the leaf)
  Tensor cast;
};

struct AutocastState {
  std::array<bool, kNumDeviceTypes> enabled{false, false};
  std::array<DType, kNumDeviceTypes> dtype{kBF16, kF16};  // PyTorch's defaults
  int depth = 0;                                          // live guards on this thread
  std::vector<CacheEntry> cache;
};
thread_local AutocastState state;

size_t index_of(DeviceType type) { return static_cast<size_t>(type); }

// PyTorch's rule: casts of f32 leaves that require grad (weights) to the low dtype.
bool cacheable(const Tensor& t, DType to) {
  return t.dtype() == kF32 && (to == kBF16 || to == kF16) && t.requires_grad() && t.is_leaf();
}

Tensor cast_to(const Tensor& t, DType to) {
  if (t.dtype() == to) return t;
  if (!cacheable(t, to)) return t.to(to);
  const void* data = t.data_ptr();
  const uint64_t version = t.storage().version();
  const bool grad = GradMode::is_enabled();
  for (CacheEntry& e : state.cache) {
    if (!e.leaf.is_same(t) || e.cast.dtype() != to) continue;
    if (e.data == data && e.version == version && (e.recorded || !grad)) return e.cast;
    e = {t, data, version, grad, t.to(to)};
    return e.cast;
  }
  state.cache.push_back({t, data, version, grad, t.to(to)});
  return state.cache.back().cast;
}

}  // namespace

std::span<const AutocastRule> autocast_rules() { return kRules; }
const AutocastRule& autocast_rule(AutocastOp op) { return kRules[static_cast<size_t>(op)]; }

bool any_autocast_enabled() {
  for (const bool e : state.enabled)
    if (e) return true;
  return false;
}

std::optional<std::vector<Tensor>> autocast_inputs(AutocastOp op,
                                                   std::span<const Tensor* const> inputs) {
  const Tensor* first = nullptr;
  for (const Tensor* t : inputs) {
    if (t != nullptr && t->defined() && t->is_floating_point()) {
      first = t;
      break;
    }
  }
  if (first == nullptr || !is_autocast_enabled(first->device().type)) return std::nullopt;
  const DeviceType type = first->device().type;
  // Only floating tensors on the autocast device are cast; f64 stays f64 except under kPromote.
  const auto eligible = [&](const Tensor* t) {
    return t != nullptr && t->defined() && t->is_floating_point() && t->device().type == type;
  };
  const CastPolicy policy = autocast_rule(op).policy;
  DType target = kF32;
  if (policy == kLowerPrecision) {
    target = state.dtype[index_of(type)];
  } else if (policy == kPromote) {
    target = first->dtype();
    for (const Tensor* t : inputs)
      if (eligible(t)) target = promote_types(target, t->dtype());
  }
  std::vector<Tensor> cast;
  cast.reserve(inputs.size());
  for (const Tensor* t : inputs) {
    if (t == nullptr) {
      cast.emplace_back();
    } else if (!eligible(t) || (policy != kPromote && t->dtype() == kF64)) {
      cast.push_back(*t);
    } else {
      cast.push_back(cast_to(*t, target));
    }
  }
  return cast;
}

AutocastSuspend::AutocastSuspend(DeviceType type)
    : type_(type), previous_(state.enabled[index_of(type)]) {
  state.enabled[index_of(type)] = false;
}
AutocastSuspend::~AutocastSuspend() { state.enabled[index_of(type_)] = previous_; }

size_t autocast_cache_size() { return state.cache.size(); }

Tensor autocast_cached_cast(const Tensor& leaf) {
  for (const CacheEntry& e : state.cache)
    if (e.leaf.is_same(leaf)) return e.cast;
  return {};
}

}  // namespace detail

using detail::index_of;
using detail::state;

AutocastGuard::AutocastGuard(Device device, DType dtype, bool enabled)
    : type_(device.type),
      previous_enabled_(state.enabled[index_of(device.type)]),
      previous_dtype_(state.dtype[index_of(device.type)]) {
  EMBER_CHECK(!enabled || dtype == kBF16 || dtype == kF16, "AutocastGuard",
              "autocast runs in bf16 or f16, got ", dtype, " for ", device);
  state.enabled[index_of(type_)] = enabled;
  if (enabled) state.dtype[index_of(type_)] = dtype;
  ++state.depth;
}

AutocastGuard::~AutocastGuard() {
  state.enabled[index_of(type_)] = previous_enabled_;
  state.dtype[index_of(type_)] = previous_dtype_;
  if (--state.depth == 0) state.cache.clear();
}

bool is_autocast_enabled(DeviceType type) { return state.enabled[index_of(type)]; }
DType autocast_dtype(DeviceType type) { return state.dtype[index_of(type)]; }

}  // namespace ember
