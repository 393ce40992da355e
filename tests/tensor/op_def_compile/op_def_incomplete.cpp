// Compiled (not run) by the op_def_compile_* tests: an op whose descriptor lacks a piece does
// not build. Without a EMBER_OMIT_* macro it is complete and must compile (the control).
#include <ember/tensor/detail/autograd_hooks.h>
#include <ember/tensor/detail/op_def.h>

namespace ember::detail {
namespace {

std::vector<Tensor> twice_backward(const BackwardContext&, const Tensor& g) { return {g, g}; }

#if defined(EMBER_OMIT_BACKWARD)
EMBER_OP(kTwiceOp, define_op("twice", "TwiceBackward", saves({0}, false), nullptr, kNoAutocast,
                             uses_kernels({EMBER_KERNEL(unary)})));
#elif defined(EMBER_OMIT_KERNELS)
EMBER_OP(kTwiceOp,
         define_op("twice", "TwiceBackward", saves({0}, false), twice_backward, kNoAutocast));
#elif defined(EMBER_OMIT_NODE_NAME)
EMBER_OP(kTwiceOp, define_op("twice", "", saves({0}, false), twice_backward, kNoAutocast,
                             uses_kernels({EMBER_KERNEL(unary)})));
#else
EMBER_OP(kTwiceOp, define_op("twice", "TwiceBackward", saves({0}, false), twice_backward,
                             kNoAutocast, uses_kernels({EMBER_KERNEL(unary)})));
#endif

}  // namespace

// A front end names its op by its descriptor: with none defined (EMBER_OMIT_DESCRIPTOR) the
// scope below has nothing to name and the file does not build.
Tensor twice(const Tensor& t) {
#if defined(EMBER_OMIT_DESCRIPTOR)
  AutogradScope scope(kUndefinedOp, {&t});
#else
  AutogradScope scope(kTwiceOp, {&t});
#endif
  return scope.finish(t);
}

}  // namespace ember::detail
