// How op front ends apply the autocast policy (tensor/autocast.h). Each autocast-aware op
// starts with one call:
//
//   if (auto out = detail::autocast(kMmOp, {&a, &b},
//                                   [](const auto& x) { return mm(x[0], x[1]); }))
//     return *out;
//
// When autocast is on for the inputs' device type, the floating inputs are cast as the op's
// descriptor says (OpDef::autocast, op_def.h) and the op runs again on
// them with autocast suspended, as PyTorch re-dispatches below its autocast key: what the op
// does inside (helpers, composite parts) is not cast a second time. Otherwise it returns
// nullopt at the cost of one thread-local read and the op goes on as usual.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "../autocast.h"
#include "../tensor.h"
#include "op_def.h"

namespace ember::detail {

// An op as autocast sees it: its descriptor, whose `autocast` field is its rule.
using AutocastOp = OpDef;

// One row of the autocast lists: an op's PyTorch name and its policy.
struct AutocastRule {
  std::string_view name;
  CastPolicy policy;
};

// The autocast lists: every descriptor with a policy, sorted by name.
std::span<const AutocastRule> autocast_rules();

// True when some autocast guard is on for any device type on this thread (the fast path).
bool any_autocast_enabled();

// The inputs cast by `op`'s rule (undefined and non-floating inputs pass through), or nullopt
// when autocast is off for the device type of the first defined floating input.
std::optional<std::vector<Tensor>> autocast_inputs(const OpDef& op,
                                                   std::span<const Tensor* const> inputs);

// Turns autocast off for one device type for a scope (the re-entry described above).
class AutocastSuspend {
 public:
  explicit AutocastSuspend(DeviceType type);
  ~AutocastSuspend();
  AutocastSuspend(const AutocastSuspend&) = delete;
  AutocastSuspend& operator=(const AutocastSuspend&) = delete;

 private:
  DeviceType type_;
  bool previous_;
};

template <typename F>
auto autocast_with(const OpDef& op, std::span<const Tensor* const> inputs, F&& run)
    -> std::optional<decltype(run(std::declval<const std::vector<Tensor>&>()))> {
  if (!any_autocast_enabled()) return std::nullopt;
  std::optional<std::vector<Tensor>> cast = autocast_inputs(op, inputs);
  if (!cast) return std::nullopt;
  DeviceType type = DeviceType::kCPU;
  for (const Tensor* t : inputs) {
    if (t != nullptr && t->defined() && t->is_floating_point()) {
      type = t->device().type;
      break;
    }
  }
  AutocastSuspend suspend(type);
  return run(*cast);
}

template <typename F>
auto autocast(const OpDef& op, std::initializer_list<const Tensor*> inputs, F&& run) {
  return autocast_with(op, std::span<const Tensor* const>(inputs.begin(), inputs.size()),
                       std::forward<F>(run));
}

// Tensor lists (cat, stack).
template <typename F>
auto autocast(const OpDef& op, const std::vector<Tensor>& inputs, F&& run) {
  std::vector<const Tensor*> pointers;
  if (any_autocast_enabled()) {
    pointers.reserve(inputs.size());
    for (const Tensor& t : inputs) pointers.push_back(&t);
  }
  return autocast_with(op, pointers, std::forward<F>(run));
}

// The weight-cast cache of this thread (for tests): how many casts it holds, and the cached
// low-precision cast of `leaf` (undefined when there is none).
size_t autocast_cache_size();
Tensor autocast_cached_cast(const Tensor& leaf);

}  // namespace ember::detail
