// One descriptor per op (OpDef), defined with EMBER_OP in the op's own file beside its front
// end: its names, the tensors its backward reads, the backward formula, its autocast rule and
// the kernel-table slots it runs on. The descriptor is the op's identity: the front end hands
// it to AutogradScope (autograd_hooks.h) and to detail::autocast (autocast_policy.h), and
// autograd's node runs its backward. define_op is consteval and takes every piece, so an op
// with a piece missing does not compile (tests/tensor/op_def_compile/ proves it).
//
// The tensor module holds the formulas (written with tensor ops); autograd/ only runs them
// through the BackwardContext it implements, so tensor never depends on autograd.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "../tensor.h"
#include "kernel_table.h"

namespace ember::detail {

// Called (never defined) by the consteval builders below on a malformed descriptor: the
// compiler's error names the call, so it says what is missing.
namespace op_def_error {
void saved_input_position_out_of_range();
void too_many_kernel_slots();
void op_without_pytorch_name();
void node_name_not_ending_in_Backward();
void differentiable_op_without_backward();
}  // namespace op_def_error

// The non-tensor arguments a backward formula needs; each op documents the fields it uses.
struct OpArgs {
  Scalar alpha = 1;
  double a = 0.0, b = 0.0;
  int64_t dim = 0, dim2 = 0, start = 0, step = 1, correction = 0;
  Shape dims;
  bool keepdim = false;
  bool training = false;
  Conv2dParams conv;
  Pool2dParams pool;
  std::vector<Tensor> extra;  // index tensors, masks, saved statistics
  // scaled-dot-product attention
  AttentionParams attention;
};

// What a backward formula sees of its recorded forward (implemented by autograd's node).
class BackwardContext {
 public:
  // Saved input i (listed in the op's SavePlan); ember::Error when freed by an earlier backward.
  virtual const Tensor& in(size_t i) const = 0;
  // The saved first output (SavePlan::output).
  virtual const Tensor& out() const = 0;
  // Whether input i requires grad (a formula may skip the others' gradients).
  virtual bool needs(size_t i) const = 0;
  // The shape input i had in the forward.
  virtual const Shape& shape(size_t i) const = 0;
  virtual size_t num_inputs() const = 0;
  virtual const OpArgs& args() const = 0;

 protected:
  ~BackwardContext() = default;
};

// The gradients of the inputs (undefined where none) from the gradient `g` of the first output.
using BackwardFn = std::vector<Tensor> (*)(const BackwardContext& c, const Tensor& g);

// Which forward tensors a backward reads: inputs by position (a bit each), and the first output.
struct SavePlan {
  uint32_t inputs = 0;
  bool output = false;
  constexpr bool saves_input(size_t i) const { return i < 32 && ((inputs >> i) & 1U) != 0; }
};
consteval SavePlan saves(std::initializer_list<int> inputs, bool output) {
  SavePlan plan{0, output};
  for (int i : inputs) {
    if (i < 0 || i >= 32) op_def_error::saved_input_position_out_of_range();
    plan.inputs |= 1U << i;
  }
  return plan;
}

// Autocast policies (torch.autocast's lists; see autocast_policy.h).
enum class CastPolicy : uint8_t {
  kLowerPrecision,  // floating inputs (not f64) to the guard's dtype: bf16 or f16
  kFloat32,         // floating inputs (not f64) to f32
  kPromote,         // floating inputs to the widest floating dtype among them
};
// An op on no autocast list runs in whatever dtype its inputs have.
inline constexpr std::optional<CastPolicy> kNoAutocast = std::nullopt;

// A kernel an op runs on: an entry of the shared table (EMBER_KERNEL) or one of the op's own
// (EMBER_OWN_KERNEL); filled(type) says whether that device type has it in this build.
struct KernelSlot {
  std::string_view name;
  bool (*filled)(DeviceType type) = nullptr;
};
template <auto Entry>
bool kernel_slot_filled(DeviceType type) {
  return kernel_table(type).*Entry != nullptr;
}
// KernelSlot for KernelTable::entry: EMBER_KERNEL(unary).
#define EMBER_KERNEL(entry)                                                              \
  ::ember::detail::KernelSlot {                                                          \
#entry, &::ember::detail::kernel_slot_filled < &::ember::detail::KernelTable::entry> \
  }
// KernelSlot for an op's own OpKernels object (kernel_table.h): EMBER_OWN_KERNEL(silu_kernels).
#define EMBER_OWN_KERNEL(kernels)                                                     \
  ::ember::detail::KernelSlot {                                                       \
#kernels, [](::ember::DeviceType type) { return (kernels).get(type) != nullptr; } \
  }
inline constexpr size_t kMaxKernelSlots = 4;
struct KernelSlots {
  KernelSlot slot[kMaxKernelSlots] = {};
  size_t count = 0;
};
consteval KernelSlots uses_kernels(std::initializer_list<KernelSlot> slots) {
  if (slots.size() > kMaxKernelSlots) op_def_error::too_many_kernel_slots();
  KernelSlots out;
  for (const KernelSlot& s : slots) out.slot[out.count++] = s;
  return out;
}

struct OpDef {
  std::string_view name;       // PyTorch's name of the op ("mul")
  std::string_view node_name;  // its backward node's name ("MulBackward"); empty: composite
  SavePlan save;
  BackwardFn backward = nullptr;  // null for a composite (differentiable through its parts)
  std::optional<CastPolicy> autocast;
  KernelSlots kernels;
  // Whether the backward formula records its own history under create_graph (it is written in
  // recorded ops). A first-order formula (a fused kernel) gives gradients a second backward
  // cannot go through: autograd marks them so that one reaching them is an ember::Error.
  bool twice_differentiable = true;

  bool differentiable() const { return backward != nullptr; }
  // This descriptor with a first-order backward (see twice_differentiable).
  consteval OpDef first_order() const {
    OpDef op = *this;
    op.twice_differentiable = false;
    return op;
  }
  std::span<const KernelSlot> kernel_slots() const { return {kernels.slot, kernels.count}; }
  // ggml's supports_op: whether devices of this type have every kernel this op runs on.
  bool supported_on(DeviceType type) const;
};

consteval bool ends_with_backward(std::string_view s) {
  return s.size() > 8 && s.substr(s.size() - 8) == "Backward";
}

// A differentiable primitive: every piece is required.
consteval OpDef define_op(std::string_view name, std::string_view node_name, SavePlan save,
                          BackwardFn backward, std::optional<CastPolicy> autocast,
                          KernelSlots slots) {
  if (name.empty()) op_def_error::op_without_pytorch_name();
  if (!ends_with_backward(node_name)) op_def_error::node_name_not_ending_in_Backward();
  if (backward == nullptr) op_def_error::differentiable_op_without_backward();
  return OpDef{name, node_name, save, backward, autocast, slots, true};
}
// A composite op (linear, matmul, a loss): gradients come from the primitives it calls, and
// the descriptor carries its autocast rule.
consteval OpDef define_composite(std::string_view name, std::optional<CastPolicy> autocast) {
  if (name.empty()) op_def_error::op_without_pytorch_name();
  return OpDef{name, {}, {}, nullptr, autocast, {}, true};
}

// Adds a descriptor to all_ops() at start-up (EMBER_OP's second half).
struct OpRegistration {
  explicit OpRegistration(const OpDef& op);
};
// Every registered descriptor, sorted by name.
std::vector<const OpDef*> all_ops();

// Defines descriptor `var` in the op's file and registers it:
//   EMBER_OP(kMulOp, define_op("mul", "MulBackward", saves({0, 1}, false), mul_backward,
//                              kNoAutocast, uses_kernels({EMBER_KERNEL(binary)})));
#define EMBER_OP(var, ...)                            \
  constexpr ::ember::detail::OpDef var = __VA_ARGS__; \
  [[maybe_unused]] const ::ember::detail::OpRegistration var##_registration { var }

}  // namespace ember::detail
