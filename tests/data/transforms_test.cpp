// Transforms: crop offsets and padding, flip, resize, to_tensor, normalisation, and the
// per-sample random stream that makes augmentation independent of the worker count.
#include <ember/data/transforms.h>
#include <ember/tensor/ops.h>

#include <set>

#include "test_util.h"

namespace ember::data {
namespace {

// An [h, w, 2] u8 image whose pixel (y, x) holds (y + 1, x + 1): every pixel names itself,
// and zero padding is distinguishable from the image.
Tensor coordinate_image(int64_t h, int64_t w) {
  std::vector<uint8_t> v;
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      v.push_back(static_cast<uint8_t>(y + 1));
      v.push_back(static_cast<uint8_t>(x + 1));
    }
  return from_vector(v, {h, w, 2});
}

// (y + 1, x + 1) at output pixel (oy, ox) of an [H, W, 2] u8 tensor.
std::pair<int, int> at(const Tensor& image, int64_t oy, int64_t ox) {
  const Tensor c = image.contiguous();
  const uint8_t* p = c.data_ptr<uint8_t>() + (oy * c.size(1) + ox) * 2;
  return {p[0], p[1]};
}

TEST(SampleRng, SequenceIsAPureFunctionOfSeedEpochAndIndex) {
  auto draws = [](uint64_t seed, uint64_t epoch, int64_t index) {
    SampleRng rng(seed, epoch, index);
    std::vector<uint32_t> v;
    for (int i = 0; i < 9; ++i) v.push_back(rng.next_u32());  // spans three Philox blocks
    return v;
  };
  EXPECT_EQ(draws(1, 2, 3), draws(1, 2, 3));
  EXPECT_NE(draws(1, 2, 3), draws(2, 2, 3));
  EXPECT_NE(draws(1, 2, 3), draws(1, 3, 3));
  EXPECT_NE(draws(1, 2, 3), draws(1, 2, 4));
  SampleRng rng(0, 0, 0);
  std::set<int64_t> seen;
  for (int i = 0; i < 2000; ++i) {
    const double u = rng.uniform();
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
    const int64_t k = rng.uniform_int(-2, 2);
    EXPECT_GE(k, -2);
    EXPECT_LE(k, 2);
    seen.insert(k);
  }
  EXPECT_EQ(seen.size(), 5u);
  EXPECT_EQ(rng.uniform_int(4, 4), 4);
  EXPECT_EMBER_ERROR(rng.uniform_int(3, 2), "empty range [3, 2]");
}

TEST(Crop, WindowInsideTheImage) {
  const Tensor img = coordinate_image(6, 8);
  const Tensor out = crop(img, 2, 3, 3, 4);
  ASSERT_EQ(out.sizes(), (Shape{3, 4, 2}));
  for (int64_t y = 0; y < 3; ++y)
    for (int64_t x = 0; x < 4; ++x)
      EXPECT_EQ(at(out, y, x), std::make_pair(static_cast<int>(y + 3), static_cast<int>(x + 4)));
}

TEST(Crop, ZeroPaddingOutsideTheImage) {
  const Tensor img = coordinate_image(4, 4);
  const Tensor out = crop(img, -2, -1, 4, 6);  // rows -2..1, cols -1..4
  for (int64_t y = 0; y < 4; ++y)
    for (int64_t x = 0; x < 6; ++x) {
      const int64_t sy = y - 2, sx = x - 1;
      const bool inside = sy >= 0 && sy < 4 && sx >= 0 && sx < 4;
      const auto expected = inside
                                ? std::make_pair(static_cast<int>(sy + 1), static_cast<int>(sx + 1))
                                : std::make_pair(0, 0);
      EXPECT_EQ(at(out, y, x), expected) << y << "," << x;
    }
}

TEST(Crop, ReflectPaddingMirrorsAboutTheEdgePixel) {
  const Tensor img = coordinate_image(4, 5);
  const Tensor out = crop(img, -2, -3, 8, 11, PadMode::kReflect);  // rows -2..5, cols -3..7
  const int rows[8] = {2, 1, 0, 1, 2, 3, 2, 1};                    // PyTorch's "reflect"
  const int cols[11] = {3, 2, 1, 0, 1, 2, 3, 4, 3, 2, 1};
  for (int64_t y = 0; y < 8; ++y)
    for (int64_t x = 0; x < 11; ++x)
      EXPECT_EQ(at(out, y, x), std::make_pair(rows[y] + 1, cols[x] + 1));
  EXPECT_EMBER_ERROR(crop(img, -4, 0, 2, 2, PadMode::kReflect),
                     "reflect padding can mirror at most 3 rows");
  EXPECT_EMBER_ERROR(crop(img.to(kF32), 0, 0, 2, 2), "expects a u8 image [H, W, C]");
  EXPECT_EMBER_ERROR(crop(img, 0, 0, 0, 2), "window must be non-empty");
}

TEST(RandomCrop, OffsetsCoverThePaddedRangeAndFollowTheRng) {
  const Tensor img = coordinate_image(8, 8);
  RandomCrop t(8, 8, 2);
  std::set<std::pair<int, int>> offsets;
  for (int64_t index = 0; index < 400; ++index) {
    SampleRng rng(11, 0, index);
    const Tensor out = t.apply(img, rng);
    ASSERT_EQ(out.sizes(), (Shape{8, 8, 2}));
    // Find the offset from any pixel that came from the image, then check every pixel.
    int dy = 99, dx = 99;
    for (int64_t y = 0; y < 8 && dy == 99; ++y)
      for (int64_t x = 0; x < 8 && dy == 99; ++x) {
        const auto [vy, vx] = at(out, y, x);
        if (vy != 0) {
          dy = vy - 1 - static_cast<int>(y);
          dx = vx - 1 - static_cast<int>(x);
        }
      }
    ASSERT_GE(dy, -2);
    ASSERT_LE(dy, 2);
    ASSERT_GE(dx, -2);
    ASSERT_LE(dx, 2);
    EXPECT_TRUE(equal(out, crop(img, dy, dx, 8, 8)));
    offsets.insert({dy, dx});
    SampleRng again(11, 0, index);
    EXPECT_TRUE(equal(out, t.apply(img, again)));
  }
  EXPECT_EQ(offsets.size(), 25u);  // every (top, left) in [-2, 2]^2 occurs
  SampleRng rng(0, 0, 0);
  EXPECT_EMBER_ERROR(RandomCrop(13, 8, 2).apply(img, rng),
                     "crop 13x8 is larger than the image [8, 8, 2] padded by 2");
  EXPECT_EMBER_ERROR(RandomCrop(8, 8, -1), "padding must be >= 0");
}

TEST(Flip, MirrorsColumnsAndRandomFlipFollowsP) {
  const Tensor img = coordinate_image(3, 5);
  const Tensor f = hflip(img);
  for (int64_t y = 0; y < 3; ++y)
    for (int64_t x = 0; x < 5; ++x)
      EXPECT_EQ(at(f, y, x), std::make_pair(static_cast<int>(y + 1), static_cast<int>(5 - x)));
  EXPECT_TRUE(equal(hflip(f), img));
  const Tensor rgb = from_vector(std::vector<uint8_t>{1, 2, 3, 4, 5, 6}, {1, 2, 3});
  EXPECT_EQ(hflip(rgb).to_vector<int64_t>(), (std::vector<int64_t>{4, 5, 6, 1, 2, 3}));

  int flipped = 0;
  for (int64_t index = 0; index < 1000; ++index) {
    SampleRng never(3, 1, index), always(3, 1, index), half(3, 1, index);
    EXPECT_TRUE(equal(RandomHorizontalFlip(0.0).apply(img, never), img));
    EXPECT_TRUE(equal(RandomHorizontalFlip(1.0).apply(img, always), f));
    flipped += equal(RandomHorizontalFlip().apply(img, half), f) ? 1 : 0;
  }
  EXPECT_GT(flipped, 430);
  EXPECT_LT(flipped, 570);
  EXPECT_EMBER_ERROR(RandomHorizontalFlip(1.5), "p must be in [0, 1], got 1.5");
}

TEST(Resize, BilinearWithAlignedPixelCentres) {
  const Tensor row = from_vector(std::vector<uint8_t>{0, 100}, {1, 2, 1});
  EXPECT_EQ(resize(row, 1, 4).to_vector<int64_t>(), (std::vector<int64_t>{0, 25, 75, 100}));
  const Tensor four = from_vector(std::vector<uint8_t>{0, 25, 75, 100}, {1, 4, 1});
  EXPECT_EQ(resize(four, 1, 2).to_vector<int64_t>(), (std::vector<int64_t>{13, 88}));
  const Tensor square = from_vector(std::vector<uint8_t>{0, 100, 200, 40}, {2, 2, 1});
  // Output (1, 1) of 4x4 samples source (0.25, 0.25): bilinear of the four corners.
  const auto big = resize(square, 4, 4).to_vector<int64_t>();
  EXPECT_EQ(big[0], 0);
  // rows blend to 0 + 0.25 * 100 = 25 and 200 + 0.25 * (40 - 200) = 160, then 25 + 0.25 * 135
  EXPECT_EQ(big[5], 59);  // 58.75 rounded
  const Tensor img = coordinate_image(5, 7);
  EXPECT_TRUE(equal(resize(img, 5, 7), img));
  const Tensor flat = full({9, 13, 3}, 77, kU8);
  EXPECT_TRUE(equal(resize(flat, 4, 20), full({4, 20, 3}, 77, kU8)));

  SampleRng rng(0, 0, 0);
  EXPECT_EQ(Resize(20).apply(full({40, 80, 3}, 1, kU8), rng).sizes(), (Shape{20, 40, 3}));
  EXPECT_EQ(Resize(20).apply(full({90, 30, 3}, 1, kU8), rng).sizes(), (Shape{60, 20, 3}));
  EXPECT_EQ(Resize(6, 9).apply(full({90, 30, 3}, 1, kU8), rng).sizes(), (Shape{6, 9, 3}));
  EXPECT_EMBER_ERROR(resize(img, 0, 3), "target size must be positive");
}

TEST(CenterCrop, TorchvisionOffsetsAndZeroPadding) {
  SampleRng rng(0, 0, 0);
  const Tensor img = coordinate_image(5, 6);
  EXPECT_TRUE(equal(CenterCrop(3, 2).apply(img, rng), crop(img, 1, 2, 3, 2)));
  EXPECT_TRUE(equal(CenterCrop(4, 3).apply(img, rng),
                    crop(img, 0, 2, 4, 3)));  // round(0.5) = 0, round(1.5) = 2
  EXPECT_TRUE(equal(CenterCrop(7, 8).apply(img, rng), crop(img, -1, -1, 7, 8)));
  EXPECT_EQ(at(CenterCrop(7, 8).apply(img, rng), 0, 0), std::make_pair(0, 0));
}

TEST(ToTensor, HwcU8ToChwF32InUnitRange) {
  const Tensor img = from_vector(std::vector<uint8_t>{0, 51, 255, 102, 204, 1}, {1, 2, 3});
  const Tensor t = to_tensor(img);
  ASSERT_EQ(t.sizes(), (Shape{3, 1, 2}));
  ASSERT_EQ(t.dtype(), kF32);
  const std::vector<float> expected = {0.0f,         102 / 255.0f, 51 / 255.0f,
                                       204 / 255.0f, 1.0f,         1 / 255.0f};
  EXPECT_EQ(t.to_vector<float>(), expected);
  EXPECT_EMBER_ERROR(to_tensor(t), "expects a u8 image [H, W, C] on the CPU, got f32 [3, 1, 2]");
}

TEST(Normalize, SubtractsMeanAndDividesByStdPerChannel) {
  const Tensor t = from_vector(std::vector<float>{0.0f, 1.0f, 0.5f, 0.25f}, {2, 1, 2});
  const Tensor n = normalize(t, {0.5f, 0.25f}, {0.5f, 2.0f});
  EXPECT_EQ(n.to_vector<float>(), (std::vector<float>{-1.0f, 1.0f, 0.125f, 0.0f}));
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0.0f, 1.0f, 0.5f, 0.25f}));  // untouched
  EXPECT_EMBER_ERROR(normalize(t, {0.5f}, {0.5f}), "[2, 1, 2] has 2 channels but got 1 means");
  EXPECT_EMBER_ERROR(normalize(coordinate_image(2, 2), {0, 0}, {1, 1}),
                     "normalize goes after ToTensor");
  EXPECT_EMBER_ERROR(Normalize({0.5f}, {0.0f}), "std must be finite and non-zero");
  EXPECT_EMBER_ERROR(Normalize({0.5f, 1.0f}, {1.0f}), "got 2 and 1");
}

TEST(Compose, ChainsTransformsOnOneRng) {
  std::vector<uint8_t> pixels(32 * 32 * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 13);
  const Tensor img = from_vector(pixels, {32, 32, 3});
  const std::vector<float> mean = {0.49f, 0.48f, 0.45f}, stdev = {0.25f, 0.24f, 0.26f};
  Compose pipeline({std::make_shared<RandomCrop>(32, 32, 4),
                    std::make_shared<RandomHorizontalFlip>(), std::make_shared<ToTensor>(),
                    std::make_shared<Normalize>(mean, stdev)});
  SampleRng a(5, 2, 17), b(5, 2, 17);
  const Tensor out = pipeline.apply(img, a);
  ASSERT_EQ(out.sizes(), (Shape{3, 32, 32}));
  // The same steps by hand, drawing from one rng in the same order.
  Tensor manual = RandomCrop(32, 32, 4).apply(img, b);
  manual = RandomHorizontalFlip().apply(manual, b);
  manual = normalize(to_tensor(manual), mean, stdev);
  EXPECT_TRUE(equal(out, manual));
  EXPECT_EMBER_ERROR(Compose({nullptr}), "transform 0 is null");
}

}  // namespace
}  // namespace ember::data
