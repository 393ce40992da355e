// How the tensor module reaches autograd without depending on it: autograd/ registers an
// AutogradHooks table at start-up, and every differentiable primitive's front end wraps its
// computation in an AutogradScope naming the op's descriptor (op_def.h), which records the op
// when an input requires grad.
//
// NOTE: composite ops (matmul, stack, norm, ...) are written in terms of primitives and get
// their gradients through them; only primitives open an AutogradScope. Inside a scope grad
// mode is off, so the primitive's own helper calls record nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "../grad_mode.h"
#include "../tensor.h"
#include "op_def.h"

namespace ember::detail {

struct AutogradHooks {
  // Attaches a backward node running `op`'s descriptor to `outputs` (their inputs are `inputs`).
  void (*record)(const OpDef& op, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                 OpArgs&& args) = nullptr;
  void (*backward)(const Tensor& root, const Tensor& gradient, bool retain_graph,
                   bool create_graph) = nullptr;
  void (*register_hook)(const Tensor& t, std::function<Tensor(const Tensor&)> hook) = nullptr;
  void (*retain_grad)(const Tensor& t) = nullptr;
};

// Null until the autograd module registers itself.
const AutogradHooks* autograd_hooks();
void set_autograd_hooks(const AutogradHooks* hooks);
// The hooks, or ember::Error naming `op` when the autograd module is not linked in.
const AutogradHooks& require_autograd(const char* op);

// True when grad mode is on and any input requires grad.
bool grad_needed(std::initializer_list<const Tensor*> inputs);

// ember::Error when an in-place op would modify a tensor autograd is tracking, or write a
// value that requires grad into a tensor (history cannot be rebased in place).
void check_inplace(const char* op, const Tensor& self,
                   std::initializer_list<const Tensor*> others = {});

class AutogradScope {
 public:
  AutogradScope(const OpDef& op, std::initializer_list<const Tensor*> inputs);
  AutogradScope(const OpDef& op, const std::vector<Tensor>& inputs);
  ~AutogradScope() { GradMode::set_enabled(previous_mode_); }
  AutogradScope(const AutogradScope&) = delete;
  AutogradScope& operator=(const AutogradScope&) = delete;

  bool recording() const { return recording_; }
  // Records the op (when needed) with the given outputs and returns the first.
  Tensor finish(Tensor output, OpArgs&& args = {});
  void finish_all(std::span<const Tensor> outputs, OpArgs&& args = {});

 private:
  const OpDef& op_;
  bool previous_mode_;
  bool recording_;
  std::vector<Tensor> inputs_;
};

}  // namespace ember::detail
