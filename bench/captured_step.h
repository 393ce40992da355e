// A whole training step in one CUDA graph, as ember-train --cuda-graphs captures it: the
// benchmarks' --cuda-graphs. The optimizer is made capturable (its lr and step counts read on
// the device), a few eager steps warm up cuDNN's algorithms, the allocator and the optimizer's
// state, then `body` (forward, loss, backward, the optimizer step with any loss scaling) is
// captured once with the gradients allocated in the graph's pool; each graph.replay() is then
// one step.
#pragma once

#include <functional>
#include <string>

#include <ember/ember.h>

namespace ember::bench {

inline void capture_training_step(cuda::CUDAGraph& graph, optim::Optimizer& optimizer,
                                  const std::function<void()>& body, int warmup_steps = 3) {
  optimizer.set_capturable(true);
  for (int i = 0; i < warmup_steps; ++i) {
    optimizer.zero_grad();
    optimizer.prepare_capturable();
    body();
  }
  const std::string why = optimizer.device_step_refusal();
  EMBER_CHECK(why.empty(), "--cuda-graphs", "the optimizer step cannot be captured (", why, ")");
  optimizer.zero_grad();  // the capture's backward allocates the gradients in its pool
  optimizer.prepare_capturable();
  cuda::capture(graph, body);
}

}  // namespace ember::bench
