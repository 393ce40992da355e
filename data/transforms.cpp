#include "transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include <ember/tensor/detail/philox.h>
#include <ember/tensor/error.h>
#include <ember/tensor/ops.h>

#include "detail/random.h"

namespace ember::data {

SampleRng::SampleRng(uint64_t seed, uint64_t epoch, int64_t index)
    : key_(detail::mix64(seed ^ detail::kTransformSalt)),
      epoch_(epoch),
      index_(static_cast<uint64_t>(index)) {}

uint32_t SampleRng::next_u32() {
  if (used_ == 4) {
    // NOTE: Philox's 64-bit counter holds (sample index, block): 2^24 blocks of four words
    // per sample, far more than any transform chain draws.
    EMBER_ASSERT(block_ < (1ull << 24), "SampleRng: more than 2^26 draws for one sample");
    const auto out = ember::detail::philox(key_, epoch_, (index_ << 24) | block_++);
    std::memcpy(words_, out.x, sizeof(words_));
    used_ = 0;
  }
  return words_[used_++];
}

double SampleRng::uniform() {
  const uint32_t hi = next_u32();
  const uint32_t lo = next_u32();
  return ember::detail::philox_uniform_double(hi, lo);
}

int64_t SampleRng::uniform_int(int64_t low, int64_t high) {
  EMBER_CHECK(low <= high, "SampleRng::uniform_int", "empty range [", low, ", ", high, "]");
  const uint64_t range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low) + 1;
  const uint64_t bits = (static_cast<uint64_t>(next_u32()) << 32) | next_u32();
  return range == 0 ? static_cast<int64_t>(bits) : low + static_cast<int64_t>(bits % range);
}

namespace {

// The u8 [H, W, C] image an image transform works on (contiguous), or an ember::Error
// telling the caller where the transform belongs in the pipeline.
Tensor image_arg(const Tensor& image, const char* op) {
  EMBER_CHECK(image.defined(), op, "got an undefined tensor");
  EMBER_CHECK(image.dim() == 3 && image.dtype() == kU8 && image.is_cpu(), op,
              "expects a u8 image [H, W, C] on the CPU, got ", image.dtype(), " ",
              shape_str(image.sizes()), " on ", image.device(),
              " (image transforms go before ToTensor)");
  return image.contiguous();
}

int64_t reflect_index(int64_t i, int64_t n) {
  if (i < 0) return -i;
  if (i >= n) return 2 * (n - 1) - i;
  return i;
}

}  // namespace

Tensor crop(const Tensor& image, int64_t top, int64_t left, int64_t height, int64_t width,
            PadMode mode) {
  const Tensor src = image_arg(image, "crop");
  const int64_t h = src.size(0), w = src.size(1), c = src.size(2);
  EMBER_CHECK(height > 0 && width > 0, "crop", "window must be non-empty, got ", height, "x",
              width);
  if (mode == PadMode::kReflect) {
    const bool fits = top > -h && left > -w && top + height < 2 * h && left + width < 2 * w;
    EMBER_CHECK(fits, "crop", "reflect padding can mirror at most ", h - 1, " rows and ", w - 1,
                " columns past the edge of a ", shape_str(src.sizes()), " image, but window (top ",
                top, ", left ", left, ", ", height, "x", width, ") reaches further");
  }
  Tensor out = empty({height, width, c}, kU8);
  const uint8_t* in = src.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  // Columns [x0, x1) of the window read the image directly; the rest are padding.
  const int64_t x0 = std::clamp<int64_t>(-left, 0, width);
  const int64_t x1 = std::clamp<int64_t>(w - left, x0, width);
  const size_t pixel = static_cast<size_t>(c);
  for (int64_t y = 0; y < height; ++y) {
    uint8_t* row = dst + y * width * c;
    int64_t sy = top + y;
    if (sy < 0 || sy >= h) {
      if (mode == PadMode::kZeros) {
        std::memset(row, 0, static_cast<size_t>(width * c));
        continue;
      }
      sy = reflect_index(sy, h);
    }
    const uint8_t* src_row = in + sy * w * c;
    for (int64_t x = 0; x < x0; ++x) {
      if (mode == PadMode::kZeros) {
        std::memset(row + x * c, 0, pixel);
      } else {
        std::memcpy(row + x * c, src_row + reflect_index(left + x, w) * c, pixel);
      }
    }
    if (x1 > x0) {
      std::memcpy(row + x0 * c, src_row + (left + x0) * c, static_cast<size_t>((x1 - x0) * c));
    }
    for (int64_t x = x1; x < width; ++x) {
      if (mode == PadMode::kZeros) {
        std::memset(row + x * c, 0, pixel);
      } else {
        std::memcpy(row + x * c, src_row + reflect_index(left + x, w) * c, pixel);
      }
    }
  }
  return out;
}

Tensor hflip(const Tensor& image) {
  const Tensor src = image_arg(image, "hflip");
  const int64_t h = src.size(0), w = src.size(1), c = src.size(2);
  Tensor out = empty(src.sizes(), kU8);
  const uint8_t* in = src.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  for (int64_t y = 0; y < h; ++y) {
    const uint8_t* src_row = in + y * w * c;
    uint8_t* row = dst + y * w * c;
    if (c == 3) {
      for (int64_t x = 0; x < w; ++x) {
        const uint8_t* p = src_row + (w - 1 - x) * 3;
        row[x * 3] = p[0];
        row[x * 3 + 1] = p[1];
        row[x * 3 + 2] = p[2];
      }
    } else {
      for (int64_t x = 0; x < w; ++x) {
        std::memcpy(row + x * c, src_row + (w - 1 - x) * c, static_cast<size_t>(c));
      }
    }
  }
  return out;
}

Tensor resize(const Tensor& image, int64_t height, int64_t width) {
  const Tensor src = image_arg(image, "resize");
  const int64_t h = src.size(0), w = src.size(1), c = src.size(2);
  EMBER_CHECK(height > 0 && width > 0, "resize", "target size must be positive, got ", height, "x",
              width);
  EMBER_CHECK(h > 0 && w > 0, "resize", "cannot resize an empty image ", shape_str(src.sizes()));
  Tensor out = empty({height, width, c}, kU8);
  const uint8_t* in = src.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  // Source coordinate of each output column: its weight and the two pixels it blends.
  struct Tap {
    int64_t i0, i1;
    float frac;
  };
  auto taps = [](int64_t out_size, int64_t in_size) {
    std::vector<Tap> result(static_cast<size_t>(out_size));
    const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
    for (int64_t o = 0; o < out_size; ++o) {
      const double s = std::max(0.0, (static_cast<double>(o) + 0.5) * scale - 0.5);
      const int64_t i0 = std::min(static_cast<int64_t>(s), in_size - 1);
      const int64_t i1 = std::min(i0 + 1, in_size - 1);
      result[static_cast<size_t>(o)] = {i0, i1, static_cast<float>(s - static_cast<double>(i0))};
    }
    return result;
  };
  const std::vector<Tap> ys = taps(height, h), xs = taps(width, w);
  for (int64_t y = 0; y < height; ++y) {
    const Tap& ty = ys[static_cast<size_t>(y)];
    const uint8_t* r0 = in + ty.i0 * w * c;
    const uint8_t* r1 = in + ty.i1 * w * c;
    for (int64_t x = 0; x < width; ++x) {
      const Tap& tx = xs[static_cast<size_t>(x)];
      for (int64_t k = 0; k < c; ++k) {
        const float top = r0[tx.i0 * c + k] + tx.frac * (r0[tx.i1 * c + k] - r0[tx.i0 * c + k]);
        const float bottom = r1[tx.i0 * c + k] + tx.frac * (r1[tx.i1 * c + k] - r1[tx.i0 * c + k]);
        const float value = top + ty.frac * (bottom - top);
        dst[(y * width + x) * c + k] =
            static_cast<uint8_t>(std::clamp(std::lround(value), 0L, 255L));
      }
    }
  }
  return out;
}

Tensor to_tensor(const Tensor& image) {
  const Tensor src = image_arg(image, "to_tensor");
  const int64_t h = src.size(0), w = src.size(1), c = src.size(2);
  static const auto kScale = [] {
    std::vector<float> table(256);
    for (int v = 0; v < 256; ++v) table[static_cast<size_t>(v)] = static_cast<float>(v) / 255.0f;
    return table;
  }();
  Tensor out = empty({c, h, w}, kF32);
  const uint8_t* in = src.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  const int64_t plane = h * w;
  for (int64_t p = 0; p < plane; ++p) {
    for (int64_t k = 0; k < c; ++k) dst[k * plane + p] = kScale[in[p * c + k]];
  }
  return out;
}

Tensor normalize(const Tensor& tensor, const std::vector<float>& mean,
                 const std::vector<float>& std) {
  EMBER_CHECK(tensor.defined(), "normalize", "got an undefined tensor");
  EMBER_CHECK(tensor.dim() == 3 && tensor.dtype() == kF32 && tensor.is_cpu(), "normalize",
              "expects an f32 tensor [C, H, W] on the CPU, got ", tensor.dtype(), " ",
              shape_str(tensor.sizes()), " on ", tensor.device(),
              " (normalize goes after ToTensor)");
  const int64_t c = tensor.size(0);
  EMBER_CHECK(static_cast<int64_t>(mean.size()) == c && static_cast<int64_t>(std.size()) == c,
              "normalize", "tensor ", shape_str(tensor.sizes()), " has ", c, " channels but got ",
              mean.size(), " means and ", std.size(), " standard deviations");
  const Tensor src = tensor.contiguous();
  Tensor out = empty(src.sizes(), kF32);
  const float* in = src.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const int64_t plane = src.size(1) * src.size(2);
  for (int64_t k = 0; k < c; ++k) {
    const float m = mean[static_cast<size_t>(k)], s = std[static_cast<size_t>(k)];
    for (int64_t p = 0; p < plane; ++p) dst[k * plane + p] = (in[k * plane + p] - m) / s;
  }
  return out;
}

RandomCrop::RandomCrop(int64_t height, int64_t width, int64_t padding, PadMode mode)
    : height_(height), width_(width), padding_(padding), mode_(mode) {
  EMBER_CHECK(height > 0 && width > 0, "RandomCrop", "size must be positive, got ", height, "x",
              width);
  EMBER_CHECK(padding >= 0, "RandomCrop", "padding must be >= 0, got ", padding);
}

Tensor RandomCrop::apply(const Tensor& input, SampleRng& rng) const {
  const Tensor image = image_arg(input, "RandomCrop");
  const int64_t h = image.size(0), w = image.size(1);
  EMBER_CHECK(height_ <= h + 2 * padding_ && width_ <= w + 2 * padding_, "RandomCrop", "crop ",
              height_, "x", width_, " is larger than the image ", shape_str(image.sizes()),
              " padded by ", padding_);
  const int64_t top = rng.uniform_int(0, h + 2 * padding_ - height_) - padding_;
  const int64_t left = rng.uniform_int(0, w + 2 * padding_ - width_) - padding_;
  return crop(image, top, left, height_, width_, mode_);
}

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(p) {
  EMBER_CHECK(p >= 0.0 && p <= 1.0, "RandomHorizontalFlip", "p must be in [0, 1], got ", p);
}

Tensor RandomHorizontalFlip::apply(const Tensor& input, SampleRng& rng) const {
  return rng.uniform() < p_ ? hflip(input) : image_arg(input, "RandomHorizontalFlip");
}

Resize::Resize(int64_t size) : height_(-1), width_(size) {
  EMBER_CHECK(size > 0, "Resize", "size must be positive, got ", size);
}

Resize::Resize(int64_t height, int64_t width) : height_(height), width_(width) {
  EMBER_CHECK(height > 0 && width > 0, "Resize", "size must be positive, got ", height, "x", width);
}

Tensor Resize::apply(const Tensor& input, SampleRng& /*rng*/) const {
  if (height_ > 0) return resize(input, height_, width_);
  const Tensor image = image_arg(input, "Resize");
  const int64_t h = image.size(0), w = image.size(1);
  EMBER_CHECK(h > 0 && w > 0, "Resize", "cannot resize an empty image ", shape_str(image.sizes()));
  // The shorter side becomes width_; the longer one keeps the aspect ratio (truncated).
  if (h <= w) return resize(image, width_, std::max<int64_t>(1, width_ * w / h));
  return resize(image, std::max<int64_t>(1, width_ * h / w), width_);
}

CenterCrop::CenterCrop(int64_t height, int64_t width) : height_(height), width_(width) {
  EMBER_CHECK(height > 0 && width > 0, "CenterCrop", "size must be positive, got ", height, "x",
              width);
}

Tensor CenterCrop::apply(const Tensor& input, SampleRng& /*rng*/) const {
  const Tensor image = image_arg(input, "CenterCrop");
  // torchvision's rounding: int(round((H - h) / 2)), halves to even.
  const auto offset = [](int64_t size, int64_t window) {
    return static_cast<int64_t>(std::nearbyint(static_cast<double>(size - window) / 2.0));
  };
  return crop(image, offset(image.size(0), height_), offset(image.size(1), width_), height_, width_,
              PadMode::kZeros);
}

Tensor ToTensor::apply(const Tensor& input, SampleRng& /*rng*/) const { return to_tensor(input); }

Normalize::Normalize(std::vector<float> mean, std::vector<float> std)
    : mean_(std::move(mean)), std_(std::move(std)) {
  EMBER_CHECK(!mean_.empty() && mean_.size() == std_.size(), "Normalize",
              "needs one mean and one std per channel, got ", mean_.size(), " and ", std_.size());
  for (float s : std_) {
    EMBER_CHECK(s != 0.0f && std::isfinite(s), "Normalize", "std must be finite and non-zero, got ",
                s);
  }
}

Tensor Normalize::apply(const Tensor& input, SampleRng& /*rng*/) const {
  return normalize(input, mean_, std_);
}

Compose::Compose(std::vector<std::shared_ptr<const Transform>> transforms)
    : transforms_(std::move(transforms)) {
  for (size_t i = 0; i < transforms_.size(); ++i) {
    EMBER_CHECK(transforms_[i] != nullptr, "Compose", "transform ", i, " is null");
  }
}

Tensor Compose::apply(const Tensor& input, SampleRng& rng) const {
  Tensor result = input;
  for (const auto& t : transforms_) result = t->apply(result, rng);
  return result;
}

}  // namespace ember::data
