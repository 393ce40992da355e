// Tensor handles, views, copies, factories and printing.
#include <sched.h>

#include <algorithm>
#include <numeric>
#include <thread>

#include "test_util.h"

namespace ember {
namespace {

using testing::expect_close;

Tensor iota(const Shape& shape, DType dtype = kF32) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return arange(n, dtype).reshape(shape);
}

TEST(TensorBasics, FactoriesHaveShapeDtypeAndValues) {
  const Tensor z = zeros({2, 3});
  EXPECT_EQ(z.sizes(), (Shape{2, 3}));
  EXPECT_EQ(z.strides(), (Shape{3, 1}));
  EXPECT_EQ(z.dtype(), kF32);
  EXPECT_EQ(z.numel(), 6);
  EXPECT_TRUE(z.is_contiguous());
  EXPECT_EQ(z.to_vector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(ones({4}, kI32).to_vector<int32_t>(), std::vector<int32_t>(4, 1));
  EXPECT_EQ(full({2}, 2.5, kF64).to_vector<double>(), (std::vector<double>{2.5, 2.5}));
  EXPECT_EQ(full({3}, true, kBool).to_vector<bool>(), (std::vector<bool>{true, true, true}));
  EXPECT_EQ(arange(5).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(1, 10, 3).to_vector<int64_t>(), (std::vector<int64_t>{1, 4, 7}));
  EXPECT_EQ(arange(5, 0, -2).to_vector<int64_t>(), (std::vector<int64_t>{5, 3, 1}));
  EXPECT_EQ(arange(0.0, 1.0, 0.25, kF32).to_vector<float>(),
            (std::vector<float>{0, 0.25f, 0.5f, 0.75f}));
  EXPECT_EQ(linspace(0, 1, 5, kF64).to_vector<double>(),
            (std::vector<double>{0, 0.25, 0.5, 0.75, 1.0}));
  EXPECT_EQ(linspace(-1, 1, 1).numel(), 1);
  EXPECT_EQ(linspace(-1, 1, 0).numel(), 0);
  for (DType t : {kF32, kF64, kF16, kBF16, kI64, kI32, kU8, kBool}) {
    const Tensor e = empty({3, 0, 2}, t);
    EXPECT_EQ(e.numel(), 0);
    EXPECT_EQ(e.dtype(), t);
    EXPECT_EQ(e.nbytes(), 0u);
    EXPECT_EQ(ones({2}, t).to_vector<double>(), (std::vector<double>{1, 1}));
  }
}

TEST(TensorBasics, FromVectorAndBlob) {
  const Tensor t = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.sizes(), (Shape{2, 3}));
  EXPECT_FLOAT_EQ(t.select(1, 2).select(0, 1).item<float>(), 6.0f);
  EXPECT_EQ(from_vector<bool>({true, false}).to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
  EXPECT_EMBER_ERROR(from_vector<float>({1, 2, 3}, {2, 2}),
                     "from_vector: shape [2, 2] holds 4 elements but 3");

  std::vector<double> buffer{1, 2, 3, 4};
  Tensor borrowed = from_blob(buffer.data(), {2, 2}, kF64);
  borrowed.mul_(10.0);  // writes through to the caller's memory
  EXPECT_EQ(buffer, (std::vector<double>{10, 20, 30, 40}));
  Tensor strided = from_blob(buffer.data(), {2}, kF64, kCPU, nullptr, {2});
  EXPECT_EQ(strided.to_vector<double>(), (std::vector<double>{10, 30}));

  auto owner = std::make_shared<std::vector<int32_t>>(std::vector<int32_t>{7, 8, 9});
  Tensor kept = from_blob(owner->data(), {3}, kI32, kCPU, owner);
  std::weak_ptr<std::vector<int32_t>> weak = owner;
  owner.reset();
  EXPECT_FALSE(weak.expired());  // the tensor keeps its owner alive
  EXPECT_EQ(kept.to_vector<int32_t>(), (std::vector<int32_t>{7, 8, 9}));
  kept = Tensor();
  EXPECT_TRUE(weak.expired());
}

TEST(TensorBasics, SizeAndStrideOfAZeroDimTensorAreRefused) {
  // PyTorch: tensor(1.).size(-1) raises IndexError; ember once read past an empty shape.
  const Tensor scalar = full({}, 2.0);
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EMBER_ERROR(scalar.size(-1), "size: a 0-d tensor has no dims (asked for dim -1)");
  EXPECT_EMBER_ERROR(scalar.size(0), "size: a 0-d tensor has no dims (asked for dim 0)");
  EXPECT_EMBER_ERROR(scalar.stride(0), "stride: a 0-d tensor has no dims (asked for dim 0)");
  EXPECT_EQ(zeros({3}).size(-1), 3);
}

TEST(TensorBasics, CpuMemoryIsAligned) {
  for (int64_t n : {1, 3, 17, 1000}) {
    const Tensor t = empty({n}, kU8);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % kCpuAlignment, 0u);
  }
}

TEST(TensorBasics, CpuAllocatorReusesFreedBlocks) {
  void* first = nullptr;
  {
    const Tensor t = empty({1 << 20});  // 4 MiB
    first = t.data_ptr();
  }
  const Tensor again = empty({1 << 20});
  EXPECT_EQ(again.data_ptr(), first);  // the freed block came back
  const Tensor other = empty({1 << 20});
  EXPECT_NE(other.data_ptr(), first);  // a live block is never handed out twice
}

TEST(TensorBasics, ThreadCountIsSettable) {
  const int before = get_num_threads();
  set_num_threads(1);
  EXPECT_EQ(get_num_threads(), 1);
  EXPECT_EQ((arange(1 << 16, kF32) * 2).to_vector<float>()[100], 200.0f);
  set_num_threads(before);
  EXPECT_EQ(get_num_threads(), before);
  EXPECT_EMBER_ERROR(set_num_threads(0), "set_num_threads: thread count must be positive, got 0");
}

TEST(TensorBasics, CpuShareDividesTheAffinityMask) {
  const int cpus = available_cpus();
  EXPECT_GE(cpus, 1);
  EXPECT_LE(cpus, static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_EQ(cpu_share(1), cpus);
  EXPECT_EQ(cpu_share(2), std::max(1, cpus / 2));
  EXPECT_EQ(cpu_share(cpus + 1), 1) << "at least one thread each";
  EXPECT_EMBER_ERROR(cpu_share(0), "cpu_share: process count must be positive, got 0");
  // A narrower mask (taskset -c 0) is what counts, not the machine's CPUs.
  cpu_set_t before, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  CPU_ZERO(&one);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &before)) {
      CPU_SET(cpu, &one);
      break;
    }
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  EXPECT_EQ(available_cpus(), 1);
  EXPECT_EQ(cpu_share(4), 1);
  ASSERT_EQ(sched_setaffinity(0, sizeof before, &before), 0);
  EXPECT_EQ(available_cpus(), cpus);
}

TEST(TensorViews, ShareStorageAndIndexCorrectly) {
  const Tensor base = iota({2, 3, 4});
  const Tensor v = base.view({6, 4});
  EXPECT_TRUE(v.storage().is_same(base.storage()));
  EXPECT_EQ(base.view({-1}).sizes(), (Shape{24}));
  EXPECT_EQ(base.view({4, -1}).sizes(), (Shape{4, 6}));

  const Tensor tr = base.transpose(0, 2);  // [4, 3, 2]
  EXPECT_EQ(tr.sizes(), (Shape{4, 3, 2}));
  EXPECT_EQ(tr.strides(), (Shape{1, 4, 12}));
  EXPECT_FALSE(tr.is_contiguous());
  EXPECT_FLOAT_EQ(tr.select(0, 3).select(0, 1).select(0, 1).item<float>(), 12 + 4 + 3);

  const Tensor p = base.permute({2, 0, 1});
  EXPECT_EQ(p.sizes(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.contiguous().to_vector<float>()[1], 4.0f);

  const Tensor n = base.narrow(2, 1, 2);
  EXPECT_EQ(n.sizes(), (Shape{2, 3, 2}));
  EXPECT_EQ(n.storage_offset(), 1);
  EXPECT_EQ(n.contiguous().to_vector<float>()[0], 1.0f);

  const Tensor s = iota({10}).slice(0, 1, 8, 3);
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{1, 4, 7}));
  EXPECT_EQ(iota({10}).slice(0, -3, std::nullopt).to_vector<float>(),
            (std::vector<float>{7, 8, 9}));
  EXPECT_EQ(iota({10}).slice(0, 8, 2).numel(), 0);

  const Tensor e = iota({3, 1}).expand({2, 3, 4});
  EXPECT_EQ(e.strides(), (Shape{0, 1, 0}));
  EXPECT_EQ(e.contiguous().to_vector<float>()[5], 1.0f);
  EXPECT_EQ(iota({3, 1}).expand({-1, 2}).sizes(), (Shape{3, 2}));

  const Tensor u = iota({3}).unsqueeze(0).unsqueeze(-1);
  EXPECT_EQ(u.sizes(), (Shape{1, 3, 1}));
  EXPECT_EQ(u.squeeze().sizes(), (Shape{3}));
  EXPECT_EQ(u.squeeze(0).sizes(), (Shape{3, 1}));
  EXPECT_EQ(u.squeeze(1).sizes(), (Shape{1, 3, 1}));
  EXPECT_EQ(base.flatten(1).sizes(), (Shape{2, 12}));
  EXPECT_EQ(base.flatten().sizes(), (Shape{24}));
  EXPECT_EQ(scalar_tensor(3.0).flatten().sizes(), (Shape{1}));
  EXPECT_EQ(iota({2, 3}).t().sizes(), (Shape{3, 2}));

  const Tensor strided = base.as_strided({2, 2}, {1, 2}, 3);
  EXPECT_EQ(strided.contiguous().to_vector<float>(), (std::vector<float>{3, 5, 4, 6}));
}

TEST(TensorViews, ReshapeCopiesOnlyWhenNeeded) {
  const Tensor base = iota({4, 6});
  EXPECT_TRUE(base.reshape({2, 12}).storage().is_same(base.storage()));
  const Tensor t = base.t();
  EXPECT_EMBER_ERROR(t.view({24}), "view: cannot view a tensor of shape [6, 4]");
  const Tensor r = t.reshape({24});
  EXPECT_FALSE(r.storage().is_same(base.storage()));
  EXPECT_EQ(r.to_vector<float>()[1], 6.0f);
  // Splitting a dim of a transposed view is still a view.
  EXPECT_TRUE(t.reshape({3, 2, 4}).storage().is_same(base.storage()));
  EXPECT_EQ(t.reshape({3, 2, 4}).contiguous().to_vector<float>(),
            t.contiguous().to_vector<float>());
  EXPECT_EQ(scalar_tensor(1.0).reshape({1, 1}).sizes(), (Shape{1, 1}));
  EXPECT_EQ(zeros({0, 3}).reshape({3, 0}).sizes(), (Shape{3, 0}));
}

TEST(TensorViews, WritesThroughViewsReachTheBase) {
  Tensor base = zeros({3, 4});
  Tensor col = base.select(1, 2);
  col.fill_(7);
  Tensor row = base.narrow(0, 1, 1);
  row.add_(1);
  EXPECT_EQ(base.to_vector<float>(), (std::vector<float>{0, 0, 7, 0, 1, 1, 8, 1, 0, 0, 7, 0}));
  EXPECT_GT(base.storage().version(), 0u);
}

TEST(TensorCopies, ContiguousCloneCopyAndCasts) {
  const Tensor base = iota({3, 4});
  EXPECT_TRUE(base.contiguous().is_same(base));
  const Tensor tc = base.t().contiguous();
  EXPECT_TRUE(tc.is_contiguous());
  EXPECT_EQ(tc.to_vector<float>()[1], 4.0f);
  const Tensor c = base.clone();
  EXPECT_FALSE(c.storage().is_same(base.storage()));

  Tensor dst = zeros({3, 4}, kF64);
  dst.copy_(from_vector<float>({1, 2, 3, 4}));  // broadcast over rows, f32 -> f64
  EXPECT_EQ(dst.to_vector<double>()[7], 4.0);
  EXPECT_EMBER_ERROR(dst.copy_(zeros({3})), "copy_: shapes [3, 4] and [3] cannot broadcast");

  // Overlapping copy within one storage reads a snapshot.
  Tensor overlap = iota({5});
  overlap.narrow(0, 1, 4).copy_(overlap.narrow(0, 0, 4));
  EXPECT_EQ(overlap.to_vector<float>(), (std::vector<float>{0, 0, 1, 2, 3}));

  EXPECT_EQ(from_vector<float>({1.7f, -2.5f, 0.0f}).to(kI32).to_vector<int32_t>(),
            (std::vector<int32_t>{1, -2, 0}));
  EXPECT_EQ(from_vector<float>({1.5f, 0.0f}).to(kBool).to_vector<bool>(),
            (std::vector<bool>{true, false}));
  EXPECT_EQ(from_vector<int32_t>({300}).to(kU8).item<int64_t>(), 44);
  EXPECT_FLOAT_EQ(from_vector<float>({1.0f / 3}).to(kF16).item<float>(), 0.333251953125f);
  EXPECT_FLOAT_EQ(from_vector<float>({1.0f / 3}).to(kBF16).item<float>(), 0.333984375f);
  EXPECT_EQ(iota({2, 3}).t().to(kF64).to_vector<double>(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  EXPECT_TRUE(base.to(kF32).is_same(base));
  EXPECT_TRUE(base.to(kCPU).is_same(base));
}

TEST(TensorCopies, HalfAndBFloat16Conversions) {
  // Values chosen to exercise rounding, subnormals, overflow and specials.
  const std::vector<float> in{0.0f,     -0.0f, 1.0f,     65504.0f,  65520.0f,      6.103515625e-5f,
                              5.96e-8f, 1e-9f, INFINITY, -INFINITY, 1.0009765625f, 1.00048828125f};
  const std::vector<float> half_expected{0.0f,     -0.0f,         1.0f,          65504.0f,
                                         INFINITY, 6.1035156e-5f, 5.9604645e-8f, 0.0f,
                                         INFINITY, -INFINITY,     1.0009765625f, 1.0f};
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(static_cast<float>(Half(in[i])), half_expected[i]) << "input " << in[i];
  }
  EXPECT_TRUE(std::isnan(static_cast<float>(Half(NAN))));
  EXPECT_EQ(static_cast<float>(BFloat16(1.00390625f)), 1.0f);       // tie rounds to even
  EXPECT_EQ(static_cast<float>(BFloat16(1.01171875f)), 1.015625f);  // tie rounds up to even
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(NAN))));
  for (int bits = 0; bits < 0x7c00; bits += 37) {  // every finite half survives a round trip
    Half h;
    h.bits = static_cast<uint16_t>(bits);
    EXPECT_EQ(Half(static_cast<float>(h)).bits, h.bits);
  }
}

TEST(TensorBasics, ItemAndDataPtr) {
  EXPECT_EQ(scalar_tensor(3).item<int64_t>(), 3);
  EXPECT_EQ(scalar_tensor(3).dtype(), kI64);
  EXPECT_EQ(scalar_tensor(2.5).dtype(), kF32);
  EXPECT_EQ(scalar_tensor(true).dtype(), kBool);
  EXPECT_DOUBLE_EQ(full({1, 1}, 0.5, kF64).item<double>(), 0.5);
  EXPECT_EMBER_ERROR(zeros({2}).item(),
                     "item: a tensor with 2 elements (shape [2]) cannot be converted");
  EXPECT_EMBER_ERROR(zeros({2}).data_ptr<double>(),
                     "data_ptr: tensor has dtype f32 but f64 was asked for");
  EXPECT_NE(zeros({2}).data_ptr<float>(), nullptr);
}

TEST(TensorErrors, BadViewsNameTheOpAndValues) {
  const Tensor t = zeros({2, 3});
  EXPECT_EMBER_ERROR(t.view({4}), "view: shape [4] is invalid for input of size 6");
  EXPECT_EMBER_ERROR(t.view({-1, -1}), "view: only one dimension can be -1");
  EXPECT_EMBER_ERROR(t.transpose(0, 2),
                     "transpose: dim 2 is out of range for a tensor with 2 dims");
  EXPECT_EMBER_ERROR(t.permute({0, 0}), "permute: dim 0 repeats");
  EXPECT_EMBER_ERROR(t.permute({0}), "permute: got 1 dims");
  EXPECT_EMBER_ERROR(t.narrow(1, 2, 2),
                     "narrow: start 2 and length 2 are out of range for dim 1 of size 3");
  EXPECT_EMBER_ERROR(t.select(0, 2), "select: index 2 is out of range for dim 0 of size 2");
  EXPECT_EMBER_ERROR(t.slice(0, 0, 1, 0), "slice: step must be positive");
  EXPECT_EMBER_ERROR(t.expand({3, 3}), "expand: cannot expand shape [2, 3] to [3, 3]");
  EXPECT_EMBER_ERROR(t.expand({3}), "expand: cannot expand shape [2, 3] to [3] (fewer dims)");
  EXPECT_EMBER_ERROR(t.as_strided({4, 4}, {4, 1}), "as_strided: view of sizes [4, 4]");
  EXPECT_EMBER_ERROR(zeros({-1}), "empty: negative size in shape [-1]");
  EXPECT_EMBER_ERROR(Tensor().sizes(), "undefined tensor");
  EXPECT_EMBER_ERROR(arange(0, 5, 0), "arange: step must be nonzero");
  EXPECT_EMBER_ERROR(arange(5, 0, 1),
                     "arange: upper bound 0 and step 1 are inconsistent with start 5");
  EXPECT_EMBER_ERROR(Device("gpu"), "Device: cannot parse \"gpu\"");
  if (!cuda::is_available()) EXPECT_EMBER_ERROR(zeros({2}).pin_memory(), "pinned allocator");
  EXPECT_EMBER_ERROR(zeros({2}, TensorOptions(kF32, cuda_device()).with_pinned_memory()),
                     "empty: pinned memory is host memory");
}

TEST(TensorBasics, DevicesParseAndPrint) {
  EXPECT_EQ(Device("cpu"), kCPU);
  EXPECT_EQ(Device("cuda"), cuda_device(0));
  EXPECT_EQ(Device("cuda:3"), cuda_device(3));
  EXPECT_EQ(cuda_device(1).str(), "cuda:1");
  EXPECT_EMBER_ERROR(Device("cuda:x"), "cannot parse");
  EXPECT_EMBER_ERROR(Device("cuda:-1"), "cannot parse");
}

TEST(TensorPrinting, MatchesPyTorchStyle) {
  EXPECT_EQ(from_vector<float>({1, 2, 3, 4}, {2, 2}).str(),
            "tensor([[1., 2.],\n        [3., 4.]])");
  EXPECT_EQ(from_vector<float>({0.5f, -1.25f}).str(), "tensor([ 0.5000, -1.2500])");
  EXPECT_EQ(arange(3).str(), "tensor([0, 1, 2])");
  EXPECT_EQ(arange(3, kI32).str(), "tensor([0, 1, 2], dtype=i32)");
  EXPECT_EQ(scalar_tensor(2.5, kF64).str(), "tensor(2.5000, dtype=f64)");
  EXPECT_EQ(from_vector<bool>({true, false}).str(), "tensor([ True, False])");
  EXPECT_EQ(zeros({0}).str(), "tensor([])");
  EXPECT_EQ(zeros({2, 0}).str(), "tensor([], size=[2, 0])");
  EXPECT_EQ(from_vector<float>({1e-5f, 1.0f}).str(), "tensor([1.0000e-05, 1.0000e+00])");
  EXPECT_EQ(arange(8).reshape({2, 2, 2}).str(),
            "tensor([[[0, 1],\n         [2, 3]],\n\n        [[4, 5],\n         [6, 7]]])");
  EXPECT_EQ(arange(2000).str(), "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
  std::ostringstream os;
  os << arange(2);
  EXPECT_EQ(os.str(), "tensor([0, 1])");
}

}  // namespace
}  // namespace ember
