// Autocast: the per-thread state, the lists gathered from the op descriptors, and the
// weight-cast cache.
#include "autocast.h"

#include <array>
#include <vector>

#include "detail/autocast_policy.h"
#include "error.h"
#include "grad_mode.h"

namespace ember {

namespace detail {
namespace {

using enum CastPolicy;

// The autocast lists live in the ops' descriptors (OpDef::autocast, EMBER_OP in each op's
// file); README's "Autocast op lists" table shows them at one glance and a test checks the two
// agree. They are PyTorch's CUDA lists, applied to the CPU as well (PyTorch's own CPU lists
// keep softmax, log_softmax, exp, log, pow, rsqrt, sum and norm in the input's dtype; ember
// matches the CUDA lists there so a model gives the same dtypes on both devices). batch_norm is
// on no list, as in PyTorch: it takes a bf16/f16 input with f32 parameters and statistics and
// returns the input's dtype, and its fused forms follow it.

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

std::span<const AutocastRule> autocast_rules() {
  static const std::vector<AutocastRule> rules = [] {
    std::vector<AutocastRule> out;
    for (const OpDef* op : all_ops())
      if (op->autocast) out.push_back({op->name, *op->autocast});
    return out;
  }();
  return rules;
}

bool any_autocast_enabled() {
  for (const bool e : state.enabled)
    if (e) return true;
  return false;
}

std::optional<std::vector<Tensor>> autocast_inputs(const OpDef& op,
                                                   std::span<const Tensor* const> inputs) {
  if (!op.autocast) return std::nullopt;
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
  const CastPolicy policy = *op.autocast;
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
