// The CUDA runtime layer: availability, the caching allocator on a real device, streams,
// events, host<->device transfers and reproducible random numbers. GPU tests skip where no
// device is visible; the first test runs everywhere.
#include <utility>
#include <vector>

#include "test_util.h"

namespace ember {
namespace {

using testing::expect_close;

constexpr size_t kMiB = size_t{1} << 20;

TEST(Cuda, AvailabilityNeverThrows) {
  bool available = false;
  EXPECT_NO_THROW(available = cuda::is_available());
  EXPECT_EQ(available, cuda::device_count() > 0);
#if !EMBER_WITH_CUDA
  EXPECT_FALSE(available);
#endif
}

TEST(Cuda, WithoutADeviceCudaTensorsAreAClearError) {
  if (cuda::is_available()) GTEST_SKIP() << "a CUDA device is visible";
  EXPECT_EQ(cuda::device_count(), 0);
#if EMBER_WITH_CUDA
  EXPECT_EMBER_ERROR(zeros({2}, cuda_device()), "cannot use cuda:0: no CUDA device is visible");
  EXPECT_EMBER_ERROR(ones({2}).cuda(), "no CUDA device is visible");
  EXPECT_EMBER_ERROR(cuda::current_device(), "current_device: no CUDA device is visible");
  EXPECT_EMBER_ERROR(cuda::set_device(0), "set_device: no CUDA device is visible");
  EXPECT_EMBER_ERROR(cuda::Stream::create(0), "Stream::create: no CUDA device is visible");
  EXPECT_EMBER_ERROR(cuda::memory_stats(), "memory_stats: no CUDA device is visible");
  EXPECT_EMBER_ERROR(cuda::synchronize(), "synchronize: no CUDA device is visible");
#else
  EXPECT_EMBER_ERROR(zeros({2}, cuda_device()), "ember was built without CUDA");
  EXPECT_EMBER_ERROR(ones({2}).cuda(), "ember was built without CUDA");
  EXPECT_EMBER_ERROR(cuda::current_device(), "current_device: ember was built without CUDA");
  EXPECT_EMBER_ERROR(cuda::set_device(0), "set_device: ember was built without CUDA");
  EXPECT_EMBER_ERROR(cuda::Stream::create(), "Stream::create: ember was built without CUDA");
  EXPECT_EMBER_ERROR(cuda::memory_stats(), "memory_stats: ember was built without CUDA");
  EXPECT_EMBER_ERROR(cuda::empty_cache(), "empty_cache: ember was built without CUDA");
  EXPECT_EMBER_ERROR(cuda::Event(), "Event: ember was built without CUDA");
#endif
}

TEST(Cuda, DeviceSelection) {
  EMBER_REQUIRE_CUDA();
  const int count = cuda::device_count();
  EXPECT_GE(count, 1);
  const int original = cuda::current_device();
  cuda::set_device(count - 1);
  EXPECT_EQ(cuda::current_device(), count - 1);
  cuda::set_device(original);
  {
    cuda::DeviceGuard guard(count - 1);
    EXPECT_EQ(cuda::current_device(), count - 1);
  }
  EXPECT_EQ(cuda::current_device(), original);  // the guard gave it back
  EXPECT_EMBER_ERROR(cuda::set_device(count), "set_device: CUDA device");
  EXPECT_EMBER_ERROR(cuda::set_device(-1), "out of range");
  EXPECT_NO_THROW(cuda::synchronize());
  EXPECT_NO_THROW(cuda::synchronize(0));
}

// One "training step" worth of allocations: tensors of several sizes, GEMM and reduction
// temporaries, all freed at the end.
void allocation_step() {
  const Device gpu = cuda_device();
  std::vector<Tensor> live;
  for (int64_t n : {1, 100, 1000, 4096, 1 << 16, 1 << 19, 3 << 20}) {
    live.push_back(empty({n}, {kF32, gpu}));
  }
  const Tensor a = ones({128, 256}, gpu);
  const Tensor b = matmul(a, a.t()).relu();
  live.push_back(softmax(b, 1).sum({0}));
  live.push_back(b.to(kF16).clone());
  live.clear();
}

TEST(Cuda, SecondIdenticalStepMakesNoDeviceAllocations) {
  EMBER_REQUIRE_CUDA();
  allocation_step();
  cuda::synchronize();
  const cuda::MemoryStats before = cuda::memory_stats();
  allocation_step();
  allocation_step();
  cuda::synchronize();
  const cuda::MemoryStats after = cuda::memory_stats();
  EXPECT_EQ(after.num_device_allocs, before.num_device_allocs);
  EXPECT_EQ(after.num_device_frees, before.num_device_frees);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
}

TEST(Cuda, MemoryStatsTrackAllocatedReservedAndPeak) {
  EMBER_REQUIRE_CUDA();
  cuda::synchronize();
  cuda::empty_cache();
  cuda::reset_peak_stats();
  const cuda::MemoryStats base = cuda::memory_stats();
  EXPECT_EQ(base.peak_allocated_bytes, base.allocated_bytes);
  cuda::MemoryStats holding;
  {
    const Tensor t = empty({static_cast<int64_t>(kMiB)}, {kF32, cuda_device()});  // 4 MiB
    holding = cuda::memory_stats();
    EXPECT_GE(holding.allocated_bytes, base.allocated_bytes + 4 * kMiB);
    EXPECT_GE(holding.reserved_bytes, holding.allocated_bytes);
    EXPECT_GE(holding.peak_allocated_bytes, holding.allocated_bytes);
    EXPECT_GT(holding.num_device_allocs, base.num_device_allocs);
  }
  const cuda::MemoryStats cached = cuda::memory_stats();
  EXPECT_EQ(cached.allocated_bytes, base.allocated_bytes);
  EXPECT_EQ(cached.reserved_bytes, holding.reserved_bytes);  // kept for reuse
  EXPECT_EQ(cached.peak_allocated_bytes, holding.peak_allocated_bytes);
  cuda::empty_cache();
  const cuda::MemoryStats emptied = cuda::memory_stats();
  EXPECT_LT(emptied.reserved_bytes, cached.reserved_bytes);
  EXPECT_GT(emptied.num_device_frees, cached.num_device_frees);
  cuda::reset_peak_stats();
  const cuda::MemoryStats reset = cuda::memory_stats();
  EXPECT_EQ(reset.peak_allocated_bytes, reset.allocated_bytes);
  EXPECT_EQ(reset.peak_reserved_bytes, reset.reserved_bytes);
}

TEST(Cuda, StreamsAndStreamGuard) {
  EMBER_REQUIRE_CUDA();
  const cuda::Stream default_stream = cuda::current_stream();
  EXPECT_EQ(default_stream.handle(), nullptr);  // the legacy default stream
  EXPECT_EQ(default_stream.device(), cuda::current_device());
  const cuda::Stream side = cuda::Stream::create();
  const cuda::Stream urgent = cuda::Stream::create(-1, true);
  EXPECT_NE(side.handle(), nullptr);
  EXPECT_NE(urgent.handle(), nullptr);
  EXPECT_NE(side, urgent);
  Tensor result;
  {
    cuda::StreamGuard guard(side);
    EXPECT_EQ(cuda::current_stream(), side);
    result = (full({1 << 20}, 3.0, cuda_device()) * 2).sum();  // all queued on `side`
    side.synchronize();
    EXPECT_TRUE(side.query());
  }
  EXPECT_EQ(cuda::current_stream(), default_stream);
  EXPECT_EQ(result.item<float>(), 6.0f * (1 << 20));
  cuda::set_current_stream(urgent);
  EXPECT_EQ(cuda::current_stream(), urgent);
  cuda::set_current_stream(default_stream);
  EXPECT_EQ(cuda::current_stream(), default_stream);
}

TEST(Cuda, EventsOrderWorkAcrossStreams) {
  EMBER_REQUIRE_CUDA();
  const cuda::Stream producer = cuda::Stream::create();
  const cuda::Stream consumer = cuda::Stream::create();
  Tensor data;
  {
    cuda::StreamGuard guard(producer);
    data = full({1 << 22}, 2.0, cuda_device());
  }
  cuda::Event ready;
  EXPECT_TRUE(ready.query());  // never recorded: nothing to wait for
  ready.record(producer);
  ready.wait(consumer);
  Tensor total;
  {
    cuda::StreamGuard guard(consumer);
    total = data.sum();
    // data is in use on `consumer` too
    EXPECT_TRUE(cuda::record_stream(data.storage().data(), consumer));
    // Memory inside the block is no block of the allocator: nothing to record.
    EXPECT_FALSE(cuda::record_stream(static_cast<char*>(data.storage().data()) + 256, consumer));
  }
  data = Tensor();  // freed while `consumer` may still read it
  consumer.synchronize();
  EXPECT_EQ(total.item<float>(), 2.0f * (1 << 22));

  cuda::Event moved = std::move(ready);
  EXPECT_EQ(ready.handle(), nullptr);  // NOLINT: checking the moved-from state
  EXPECT_NE(moved.handle(), nullptr);
  moved.synchronize();
  EXPECT_TRUE(moved.query());

  cuda::Event start(true), end(true);
  start.record(producer);
  {
    cuda::StreamGuard guard(producer);
    (ones({1 << 20}, cuda_device()) + 1).sum();
  }
  end.record(producer);
  end.synchronize();
  EXPECT_GE(start.elapsed_ms(end), 0.0f);
  EXPECT_EMBER_ERROR(moved.elapsed_ms(end), "enable_timing");
}

TEST(Cuda, RoundTripsBetweenHostAndDevice) {
  EMBER_REQUIRE_CUDA();
  const Device gpu = cuda_device();
  for (DType t : {kF32, kF64, kF16, kBF16, kI64, kI32, kU8, kBool}) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor host = arange(250).to(t).reshape({10, 25});  // exact in every dtype
    const Tensor on_gpu = host.cuda();
    EXPECT_TRUE(on_gpu.is_cuda());
    expect_close(on_gpu.cpu(), host, 0, 0);
    expect_close(host.t().cuda().cpu(), host.t(), 0, 0);  // a non-contiguous source
    // non_blocking from pageable memory is still safe: the copy waits where it must.
    expect_close(host.to(gpu, true).to(kCPU, true), host, 0, 0);
    expect_close(on_gpu.clone().cpu(), host, 0, 0);  // device to device
  }
  // Pinned memory with non-blocking copies both ways.
  const Tensor values = arange(1 << 20, kF32);
  const Tensor pinned = values.pin_memory();
  ASSERT_TRUE(pinned.is_pinned());
  const Tensor on_gpu = pinned.to(gpu, true);
  Tensor back = empty({1 << 20}, TensorOptions(kF32).with_pinned_memory());
  back.copy_(on_gpu, true);
  cuda::current_stream().synchronize();
  expect_close(back, values, 0, 0);
  if (cuda::device_count() > 1) {  // across devices
    const Tensor other = on_gpu.to(cuda_device(1));
    EXPECT_EQ(other.device(), cuda_device(1));
    expect_close(other.cpu(), values, 0, 0);
    expect_close(other.to(gpu, kF64).cpu(), values.to(kF64), 0, 0);
  }
}

// Freed pinned blocks are handed out again, but not while an asynchronous copy still uses
// them: a block freed right after a non-blocking copy from it, reused at once and
// overwritten, would change what the copy delivers.
TEST(Cuda, PinnedBlocksAreReusedOnlyAfterTheirCopies) {
  EMBER_REQUIRE_CUDA();
  const TensorOptions pinned = TensorOptions(kF32).with_pinned_memory();
  const void* first = nullptr;
  {
    Tensor a = empty({1000}, pinned);
    first = a.data_ptr();
  }
  Tensor again = empty({900}, pinned);  // the same power-of-two block
  EXPECT_EQ(again.data_ptr(), first);

  const int64_t n = int64_t{1} << 24;  // 64 MiB
  const Device gpu = cuda_device();
  Tensor on_gpu = empty({n}, gpu);
  const void* source_block = nullptr;
  {
    Tensor source = full({n}, 1.0, pinned);
    source_block = source.data_ptr();
    // Matrix products queued first keep the copy from starting before the host refills.
    const Tensor a = ones({4096, 4096}, gpu);
    Tensor product;
    for (int i = 0; i < 20; ++i) product = matmul(a, a);
    on_gpu.copy_(source, /*non_blocking=*/true);
  }
  Tensor next = empty({n}, pinned);
  next.fill_(2.0);  // if `next` took the source's block mid-copy, on_gpu would see 2s
  cuda::current_stream().synchronize();
  EXPECT_EQ(on_gpu.sum().item<double>(), static_cast<double>(n));
  // Once the copy is done, its block is free to go out again.
  next = Tensor();
  Tensor later = empty({n}, pinned);
  Tensor later2 = empty({n}, pinned);
  EXPECT_TRUE(later.data_ptr() == source_block || later2.data_ptr() == source_block);
}

TEST(Cuda, RandomNumbersMatchTheCpuForTheSameSeed) {
  EMBER_REQUIRE_CUDA();
  const Device gpu = cuda_device();
  Generator cpu_gen(42), gpu_gen(42);
  EXPECT_EQ(rand({1000}, gpu, &gpu_gen).to_vector<float>(),
            rand({1000}, kF32, &cpu_gen).to_vector<float>());
  EXPECT_EQ(rand({333}, {kF64, gpu}, &gpu_gen).to_vector<double>(),
            rand({333}, kF64, &cpu_gen).to_vector<double>());
  EXPECT_EQ(randint(0, 1000, {777}, {kI64, gpu}, &gpu_gen).to_vector<int64_t>(),
            randint(0, 1000, {777}, kI64, &cpu_gen).to_vector<int64_t>());
  expect_close(randn({1000}, gpu, &gpu_gen), randn({1000}, kF32, &cpu_gen), 1e-5, 1e-5);
  EXPECT_EQ(gpu_gen.offset(), cpu_gen.offset());
}

}  // namespace
}  // namespace ember
