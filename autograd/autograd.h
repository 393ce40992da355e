// Reverse-mode automatic differentiation for ember tensors (torch.autograd's model).
//
// Mark leaves with requires_grad_(); every differentiable op then records a node, and
// loss.backward() accumulates gradients into the leaves' grad(). Including this header (the
// umbrella <ember/ember.h> does) links the autograd module in and switches recording on.
#pragma once

#include <ember/tensor/grad_mode.h>
#include <ember/tensor/tensor.h>

#include "engine.h"
#include "function.h"
#include "gradcheck.h"
#include "node.h"
#include "profiler.h"

namespace ember::autograd {

// Installs autograd's hooks into the tensor module; idempotent.
bool register_autograd();

namespace detail {
// Every translation unit that includes this header registers autograd before main().
inline const bool kAutogradRegistered = register_autograd();
}  // namespace detail

}  // namespace ember::autograd
