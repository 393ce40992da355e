// CUDA graphs (tensor/cuda_graph.h): capture, replay on new static inputs, a whole forward
// and backward step, allocation-free replays, and a capture that fails cleanly. The private
// memory pool's bookkeeping is tested without a GPU in caching_allocator_test.cpp.
#include "test_util.h"

namespace ember {
namespace {

TEST(CudaGraph, WithoutADeviceCaptureIsAClearError) {
  if (cuda::is_available()) GTEST_SKIP() << "a CUDA device is visible";
  cuda::CUDAGraph graph;
  EXPECT_THROW(graph.capture_begin(), Error);
  EXPECT_THROW(graph.replay(), Error);
  EXPECT_THROW(cuda::capture(graph, [] {}), Error);
  EXPECT_FALSE(graph.captured());
}

TEST(CudaGraph, ReplayRecomputesFromStaticInputs) {
  EMBER_REQUIRE_CUDA();
  const Device gpu = cuda_device(0);
  Tensor x = randn({4, 33}).to(gpu);
  const Tensor w = randn({33, 5}).to(gpu);
  auto work = [&] { return relu(matmul(x * 2.0 + 1.0, w)).sum({1}); };
  work();  // warm-up: cuBLAS handles and workspaces exist before the capture
  cuda::CUDAGraph graph;
  Tensor out;
  cuda::capture(graph, [&] { out = work(); });
  ASSERT_TRUE(graph.captured());
  for (int round = 0; round < 3; ++round) {
    const Tensor next = randn({4, 33});
    x.copy_(next.to(gpu));
    graph.replay();
    const Tensor expected = relu(matmul(next * 2.0 + 1.0, w.cpu())).sum({1});
    EXPECT_TRUE(allclose(out.cpu(), expected, 1e-4, 1e-4)) << "round " << round;
  }
}

TEST(CudaGraph, TrainingStepReplaysWithoutAllocating) {
  EMBER_REQUIRE_CUDA();
  const Device gpu = cuda_device(0);
  manual_seed(5);
  nn::Linear layer(16, 4);
  layer.to(gpu);
  Tensor x = randn({8, 16}).to(gpu);
  const Tensor y = randint(0, 4, {8}).to(gpu);
  auto step = [&] {
    layer.zero_grad();  // set to none: the capture's backward allocates them from its pool
    const Tensor loss = cross_entropy(layer.forward(x), y);
    loss.backward();
    return loss.detach();
  };
  for (int i = 0; i < 3; ++i) step();  // warm-up
  cuda::CUDAGraph graph;
  Tensor loss;
  cuda::capture(graph, [&] { loss = step(); });
  const Tensor grad = layer.parameters()[0].grad();
  const uint64_t allocs = cuda::memory_stats().num_device_allocs;
  for (int i = 0; i < 5; ++i) {
    const Tensor next = randn({8, 16});
    x.copy_(next.to(gpu));
    graph.replay();
    // The same step eagerly on the CPU.
    nn::Linear reference(16, 4);
    reference.load_state_dict(layer.state_dict());
    const Tensor expected = cross_entropy(reference.forward(next), y.cpu());
    expected.backward();
    EXPECT_NEAR(loss.item<double>(), expected.item<double>(), 1e-5);
    EXPECT_TRUE(allclose(grad.cpu(), reference.parameters()[0].grad(), 1e-5, 1e-5));
  }
  EXPECT_EQ(cuda::memory_stats().num_device_allocs, allocs);
}

TEST(CudaGraph, SynchronisingOpFailsTheCaptureCleanly) {
  EMBER_REQUIRE_CUDA();
  const Device gpu = cuda_device(0);
  const Tensor x = randn({64}).to(gpu);
  (x * 2.0).sum();
  const cuda::Stream before = cuda::current_stream();
  cuda::CUDAGraph graph;
  EXPECT_THROW(cuda::capture(graph, [&] { (x * 2.0).sum().item<double>(); }), Error);
  EXPECT_FALSE(graph.captured());
  EXPECT_EQ(cuda::current_stream(), before);
  // The device and the graph are usable again.
  EXPECT_NEAR((x * 2.0).sum().item<double>(), 2.0 * x.cpu().sum().item<double>(), 1e-3);
  Tensor out;
  cuda::capture(graph, [&] { out = x * 3.0; });
  graph.replay();
  EXPECT_TRUE(allclose(out.cpu(), x.cpu() * 3.0));
}

TEST(CudaGraph, ResetGivesThePoolBack) {
  EMBER_REQUIRE_CUDA();
  const Device gpu = cuda_device(0);
  const Tensor x = randn({1 << 20}).to(gpu);
  (x + 1.0).sum();
  {
    cuda::CUDAGraph graph;
    cuda::capture(graph, [&] { (x + 1.0).sum(); });
    graph.replay();
  }
  // The pool's segments are back in the general cache: the same work allocates nothing new.
  const uint64_t allocs = cuda::memory_stats().num_device_allocs;
  (x + 1.0).sum();
  EXPECT_EQ(cuda::memory_stats().num_device_allocs, allocs);
}

}  // namespace
}  // namespace ember
