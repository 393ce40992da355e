// CUDA graphs: the implementation of ember/tensor/cuda_graph.h.
#include <atomic>

#include "../cuda_graph.h"
#include "../detail/caching_allocator.h"
#include "cuda_check.h"
#include "cuda_context.h"

namespace ember::cuda {
namespace {

std::atomic<uint64_t> next_pool_id{1};  // 0 is the allocator's general cache

}  // namespace

struct CUDAGraph::Impl {
  int device = -1;
  cudaStream_t stream = nullptr;  // the side stream captures run on, owned
  Stream previous;                // the stream current before capture_begin
  bool capturing = false;
  bool pool_used = false;  // the pool may hold blocks: release it on reset
  uint64_t pool = next_pool_id++;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;

  detail::CachingAllocator& allocator() const { return detail::cuda_caching_allocator(device); }

  // The allocator and the current stream as they were before capture_begin.
  void leave_capture() {
    capturing = false;
    allocator().end_pool(stream);
    set_current_stream(previous);
  }
};

CUDAGraph::CUDAGraph() : impl_(std::make_unique<Impl>()) {}

CUDAGraph::~CUDAGraph() {
  Impl& g = *impl_;
  try {
    if (g.capturing) {
      cudaGraph_t abandoned = nullptr;
      cudaStreamEndCapture(g.stream, &abandoned);
      if (abandoned != nullptr) cudaGraphDestroy(abandoned);
      cudaGetLastError();
      g.leave_capture();
    }
    reset();
    if (g.stream != nullptr) {
      DeviceGuard guard(g.device);
      cudaStreamDestroy(g.stream);
    }
  } catch (...) {
    // A destructor cannot report a failure: only a dying CUDA context gets here.
  }
}

void CUDAGraph::capture_begin() {
  Impl& g = *impl_;
  const char* op = "CUDAGraph::capture_begin";
  EMBER_CHECK(!g.capturing, op, "a capture is already running on this graph");
  EMBER_CHECK(g.exec == nullptr, op, "the graph holds a capture already: reset() it first");
  const int device = current_device();
  EMBER_CHECK(g.device < 0 || g.device == device, op, "the graph belongs to cuda:", g.device,
              " but cuda:", device, " is current");
  if (g.stream == nullptr) {
    DeviceGuard guard(device);
    EMBER_CUDA_CHECK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
    g.device = device;
  }
  // Work queued before the capture (static inputs' copies, warm-up steps) must be done, and
  // the cached segments the capture may take over idle.
  synchronize(device);
  g.previous = current_stream(device);
  set_current_stream(Stream(g.stream, device));
  g.allocator().begin_pool(g.pool, g.stream);
  g.pool_used = true;
  const cudaError_t status = cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeThreadLocal);
  if (status != cudaSuccess) {
    g.allocator().end_pool(g.stream);
    set_current_stream(g.previous);
    EMBER_CUDA_CHECK(status);
  }
  g.capturing = true;
}

void CUDAGraph::capture_end() {
  Impl& g = *impl_;
  EMBER_CHECK(g.capturing, "CUDAGraph::capture_end", "no capture is running (capture_begin first)");
  cudaGraph_t graph = nullptr;
  const cudaError_t status = cudaStreamEndCapture(g.stream, &graph);
  g.leave_capture();
  if (status != cudaSuccess || graph == nullptr) {
    cudaGetLastError();  // the capture's error is not sticky: clear it for the next check
    if (graph != nullptr) cudaGraphDestroy(graph);
    throw Error(detail::str_cat(
        "CUDAGraph::capture_end: the capture failed: ", cudaGetErrorString(status),
        " (an op in the captured region synchronises, reads a value back to the host, or is "
        "not capturable)"));
  }
  const cudaError_t instantiated = cudaGraphInstantiate(&g.exec, graph, 0);
  if (instantiated != cudaSuccess) {
    cudaGraphDestroy(graph);
    g.exec = nullptr;
    EMBER_CUDA_CHECK(instantiated);
  }
  g.graph = graph;
}

void CUDAGraph::replay() {
  Impl& g = *impl_;
  EMBER_CHECK(g.exec != nullptr, "CUDAGraph::replay", "nothing has been captured");
  DeviceGuard guard(g.device);
  EMBER_CUDA_CHECK(cudaGraphLaunch(g.exec, detail::current_cuda_stream(g.device)));
}

void CUDAGraph::reset() {
  Impl& g = *impl_;
  EMBER_CHECK(!g.capturing, "CUDAGraph::reset", "a capture is running (capture_end first)");
  if (g.exec != nullptr) {
    synchronize(g.device);  // replays still queued read the pool's memory
    EMBER_CUDA_CHECK(cudaGraphExecDestroy(g.exec));
    g.exec = nullptr;
  }
  if (g.graph != nullptr) {
    EMBER_CUDA_CHECK(cudaGraphDestroy(g.graph));
    g.graph = nullptr;
  }
  if (g.pool_used) {
    g.allocator().release_pool(g.pool, detail::current_cuda_stream(g.device));
    g.pool = next_pool_id++;
    g.pool_used = false;
  }
}

bool CUDAGraph::captured() const { return impl_->exec != nullptr; }

uint64_t CUDAGraph::pool() const { return impl_->pool; }

void capture(CUDAGraph& graph, const std::function<void()>& work) {
  graph.capture_begin();
  try {
    work();
  } catch (...) {
    try {
      graph.capture_end();
    } catch (const Error&) {
      // The capture was invalidated by what failed: nothing to keep.
    }
    graph.reset();
    throw;
  }
  try {
    graph.capture_end();
  } catch (...) {
    graph.reset();
    throw;
  }
}

}  // namespace ember::cuda
