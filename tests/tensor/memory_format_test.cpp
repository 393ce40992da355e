// Memory formats: channels_last strides, the queries and conversions PyTorch users know, the
// *_like factories' Preserve rule, elementwise ops keeping the format, and clear errors for
// tensors that cannot be channels_last.
#include <string>

#include <ember/tensor/detail/tensor_iter.h>

#include "test_util.h"

namespace ember {
namespace {

constexpr MemoryFormat kCL = MemoryFormat::ChannelsLast;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MemoryFormat, ChannelsLastStridesAreNhwc) {
  const Tensor x = arange(2 * 3 * 4 * 5, kF32).reshape({2, 3, 4, 5});
  const Tensor y = x.contiguous(kCL);
  EXPECT_EQ(y.sizes(), (Shape{2, 3, 4, 5}));
  EXPECT_EQ(y.strides(), (Shape{60, 1, 15, 3}));
  EXPECT_TRUE(y.is_contiguous(kCL));
  EXPECT_FALSE(y.is_contiguous());
  EXPECT_FALSE(x.is_contiguous(kCL));
  EXPECT_EQ(y.suggest_memory_format(), kCL);
  EXPECT_EQ(x.suggest_memory_format(), MemoryFormat::Contiguous);
  EXPECT_TRUE(equal(x, y));  // same values, NCHW indexing
  // Element (n, c, h, w) sits at n*60 + h*15 + w*3 + c.
  EXPECT_EQ(static_cast<const float*>(y.data_ptr())[1 * 60 + 2 * 15 + 3 * 3 + 1],
            x.select(0, 1).select(0, 1).select(0, 2).select(0, 3).item<float>());
  EXPECT_TRUE(y.contiguous(kCL).is_same(y));
  EXPECT_EQ(y.contiguous().strides(), (Shape{60, 20, 5, 1}));
  EXPECT_TRUE(y.to(kCL).is_same(y));
  EXPECT_TRUE(equal(y.to(MemoryFormat::Contiguous), x));
  EXPECT_TRUE(y.to(MemoryFormat::Preserve).is_same(y));
}

TEST(MemoryFormat, SizeOneDimsFollowPyTorch) {
  // [N, 1, H, W] is dense in both layouts: contiguous(channels_last) keeps it, to() re-strides
  // it so that suggest_memory_format() says channels_last (torch 1.13 does both).
  const Tensor x = randn({2, 1, 4, 4});
  EXPECT_TRUE(x.is_contiguous(kCL));
  EXPECT_TRUE(x.contiguous(kCL).is_same(x));
  const Tensor y = x.to(kCL);
  EXPECT_EQ(y.strides(), (Shape{16, 1, 4, 1}));
  EXPECT_EQ(y.suggest_memory_format(), kCL);
  EXPECT_EQ(x.suggest_memory_format(), MemoryFormat::Contiguous);
  // A 1x1 conv weight [O, C, 1, 1]: contiguous(channels_last) keeps it too; to() re-strides.
  const Tensor w = randn({3, 5, 1, 1});
  EXPECT_TRUE(w.contiguous(kCL).is_same(w));
  EXPECT_EQ(w.to(kCL).strides(), (Shape{5, 1, 5, 5}));
  EXPECT_EQ(w.to(kCL).suggest_memory_format(), kCL);
}

TEST(MemoryFormat, LikeFactoriesPreserveTheFormat) {
  const Tensor y = randn({2, 3, 4, 5}).contiguous(kCL);
  EXPECT_EQ(empty_like(y).strides(), y.strides());
  EXPECT_EQ(zeros_like(y).strides(), y.strides());
  EXPECT_EQ(ones_like(y).strides(), y.strides());
  EXPECT_EQ(full_like(y, 2.5).strides(), y.strides());
  EXPECT_EQ(full_like(y, 2.5).sum().item<double>(), 2.5 * 120);
  EXPECT_EQ(zeros_like(y, MemoryFormat::Contiguous).strides(), (Shape{60, 20, 5, 1}));
  EXPECT_EQ(empty({2, 3, 4, 5}, kF32, kCL).strides(), (Shape{60, 1, 15, 3}));
  // Device and dtype copies keep the format, as torch's preserve_format.
  EXPECT_EQ(y.to(kF64).strides(), y.strides());
  EXPECT_TRUE(equal(y.to(kF64), y.contiguous().to(kF64)));
}

TEST(MemoryFormat, NonFourDimTensorsRefuseChannelsLast) {
  const Tensor t = randn({2, 3, 4});
  EXPECT_FALSE(t.is_contiguous(kCL));
  EXPECT_EQ(t.suggest_memory_format(), MemoryFormat::Contiguous);
  const std::string c = error_of([&] { (void)t.contiguous(kCL); });
  EXPECT_NE(c.find("contiguous"), std::string::npos) << c;
  EXPECT_NE(c.find("[2, 3, 4]"), std::string::npos) << c;
  const std::string to = error_of([&] { (void)randn({6}).to(kCL); });
  EXPECT_NE(to.find("to: "), std::string::npos) << to;
  EXPECT_NE(to.find("[6]"), std::string::npos) << to;
  const std::string like = error_of([&] { (void)empty_like(t, kCL); });
  EXPECT_NE(like.find("empty_like"), std::string::npos) << like;
  const std::string e = error_of([&] { (void)empty({5, 5}, kF32, kCL); });
  EXPECT_NE(e.find("empty"), std::string::npos) << e;
  EXPECT_NE(e.find("[5, 5]"), std::string::npos) << e;
  EXPECT_THROW((void)t.contiguous(MemoryFormat::Preserve), Error);
}

TEST(MemoryFormat, ElementwiseOpsKeepChannelsLast) {
  const Tensor a = randn({2, 3, 4, 5}), b = randn({2, 3, 4, 5});
  const Tensor bias = randn({1, 3, 1, 1});
  const Tensor ac = a.contiguous(kCL), bc = b.contiguous(kCL);
  // The same arithmetic on the same elements: bitwise equal.
  EXPECT_TRUE(equal(ac + bc, a + b));
  EXPECT_EQ((ac + bc).strides(), ac.strides());
  EXPECT_EQ((ac + bias).strides(), ac.strides());  // a broadcast bias keeps it
  EXPECT_TRUE(equal(ac + bias, a + bias));
  EXPECT_EQ(relu(ac).strides(), ac.strides());
  EXPECT_TRUE(equal(relu(ac), relu(a)));
  EXPECT_EQ((ac * 2.0).strides(), ac.strides());
  // As TensorIterator: the first full-shape operand decides.
  EXPECT_EQ((a + bc).strides(), a.strides());
  EXPECT_EQ((ac + b).strides(), ac.strides());
  Tensor inplace = ac.clone().contiguous(kCL);
  inplace.add_(b);
  EXPECT_EQ(inplace.strides(), ac.strides());
  EXPECT_TRUE(equal(inplace, a + b));
}

TEST(MemoryFormat, ChannelsLastOperandsWalkAsOneFlatRun) {
  // Elementwise kernels walk a channels-last output in memory order: operands of its layout
  // coalesce into one dense run (the flat loop), a broadcast bias into a channel-period one.
  const Tensor a = randn({2, 3, 4, 5}).contiguous(kCL), b = randn({2, 3, 4, 5}).contiguous(kCL);
  const Tensor out = empty_like(a);
  const detail::StridedIter flat = detail::make_iter({&out, &a, &b});
  EXPECT_TRUE(flat.contiguous);
  EXPECT_EQ(flat.ndim, 1);
  const Tensor bias = randn({1, 3, 1, 1}).expand({2, 3, 4, 5});
  const detail::StridedIter broadcast = detail::make_iter({&out, &a, &bias});
  EXPECT_EQ(broadcast.ndim, 2);  // [N * H * W, C]
  EXPECT_EQ(broadcast.sizes[1], 3);
}

}  // namespace
}  // namespace ember
