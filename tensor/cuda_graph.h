// CUDA graphs, as torch.cuda.CUDAGraph: record the kernels a piece of work launches once and
// replay them with one launch, removing the host's per-kernel cost. Declared in every build;
// without the CUDA backend every call throws ember::Error.
//
//   cuda::CUDAGraph graph;
//   cuda::capture(graph, [&] { out = model.forward(static_input); });  // no kernels run
//   static_input.copy_(next_batch, true);
//   graph.replay();  // out now holds next_batch's result
//
// What a capture records runs again on the same memory: inputs must be copied into the
// tensors the capture read (static buffers), and results read from the tensors it wrote.
// Tensors allocated during the capture come from the graph's private memory pool, which no
// other allocation uses while the graph lives. Nothing in the captured region may wait for
// the device or read values back to the host (item(), to_vector(), a blocking copy): such a
// call fails the capture with an ember::Error. Warm up first (a few eager runs on the side
// stream of the capture or any other): cuDNN's algorithm choice and lazily created state must
// exist before capturing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "cuda.h"

namespace ember::cuda {

class CUDAGraph {
 public:
  CUDAGraph();
  ~CUDAGraph();
  CUDAGraph(const CUDAGraph&) = delete;
  CUDAGraph& operator=(const CUDAGraph&) = delete;

  // Starts recording the calling thread's work on the current device: the device is
  // synchronised, a side stream of the graph becomes current, and allocations on it come
  // from the graph's pool. Other threads are not captured (thread-local capture mode).
  void capture_begin();
  // Stops recording, restores the previous stream and instantiates the graph. ember::Error
  // when the captured work was not capturable (the capture is then discarded).
  void capture_end();
  // Launches the recorded work on the current stream.
  void replay();
  // Drops the recorded graph and gives its memory pool back (after waiting for replays).
  void reset();
  bool captured() const;
  // The id of the graph's memory pool in the caching allocator.
  uint64_t pool() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// torch.cuda.graph(g) as a function: capture_begin, `work`, capture_end. If `work` throws
// (for instance an op that synchronises), the capture is abandoned, the graph is left empty
// and the exception is rethrown.
void capture(CUDAGraph& graph, const std::function<void()>& work);

}  // namespace ember::cuda
