// Transforms: augmentation and conversion applied to each example's input on its way into
// a batch.
//
// The geometric transforms (crop, flip, resize) work on u8 images [H, W, C], the layout the
// datasets decode to; to_tensor turns one into f32 [C, H, W] in [0, 1], and normalize works
// on that. A pipeline therefore reads as torchvision's classic one:
//
//   Compose({RandomCrop(32, 32, 4), RandomHorizontalFlip(), ToTensor(), Normalize(m, s)})
//
// Randomness comes from a SampleRng, a pure function of (seed, epoch, sample index): the
// augmentation a sample gets does not depend on which worker thread loads it, or how many
// there are.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ember/tensor/tensor.h>

namespace ember::data {

// Random numbers for one sample of one epoch: Philox keyed by the seed, counting within
// (epoch, index). Two SampleRngs built from the same triple yield the same sequence.
class SampleRng {
 public:
  SampleRng(uint64_t seed, uint64_t epoch, int64_t index);
  uint32_t next_u32();
  double uniform();  // in [0, 1)
  // Uniform integer in [low, high] (inclusive); low <= high.
  int64_t uniform_int(int64_t low, int64_t high);

 private:
  uint64_t key_;
  uint64_t epoch_;
  uint64_t index_;
  uint64_t block_ = 0;
  uint32_t words_[4] = {0, 0, 0, 0};
  int used_ = 4;
};

// How a crop fills pixels outside the image: zeros, or the image mirrored about its edge
// pixel (PyTorch's "reflect": index -1 reads index 1).
enum class PadMode { kZeros, kReflect };

// --- the operations themselves (deterministic; the Transform classes below call them) --
// The [height, width] window of `image` ([H, W, C] u8) whose top-left corner is (top, left);
// either may be negative and the window may extend past the image: those pixels come from
// `mode`. Reflection mirrors once, so the window may reach at most H-1 (W-1) pixels past an
// edge.
Tensor crop(const Tensor& image, int64_t top, int64_t left, int64_t height, int64_t width,
            PadMode mode = PadMode::kZeros);
// Mirrors an [H, W, C] u8 image left to right.
Tensor hflip(const Tensor& image);
// Bilinear resize of an [H, W, C] u8 image to [height, width, C] (pixel centres aligned, as
// PyTorch's align_corners=False; no antialiasing).
Tensor resize(const Tensor& image, int64_t height, int64_t width);
// u8 [H, W, C] -> f32 [C, H, W], each value divided by 255.
Tensor to_tensor(const Tensor& image);
// (x - mean[c]) / std[c] for each channel c of an f32 [C, H, W] tensor.
Tensor normalize(const Tensor& tensor, const std::vector<float>& mean,
                 const std::vector<float>& std);

class Transform {
 public:
  virtual ~Transform() = default;
  // Returns the transformed input; never modifies `input` (it may be a dataset's storage).
  virtual Tensor apply(const Tensor& input, SampleRng& rng) const = 0;
};

// A height x width window at a uniformly random position of the image padded by `padding`
// pixels on every side (torchvision's RandomCrop(size, padding)).
class RandomCrop : public Transform {
 public:
  RandomCrop(int64_t height, int64_t width, int64_t padding = 0, PadMode mode = PadMode::kZeros);
  Tensor apply(const Tensor& input, SampleRng& rng) const override;

 private:
  int64_t height_, width_, padding_;
  PadMode mode_;
};

// Mirrors the image left to right with probability p.
class RandomHorizontalFlip : public Transform {
 public:
  explicit RandomHorizontalFlip(double p = 0.5);
  Tensor apply(const Tensor& input, SampleRng& rng) const override;

 private:
  double p_;
};

// Resize to [height, width], or (one size) the shorter side to `size` keeping the aspect
// ratio, as torchvision's Resize(int).
class Resize : public Transform {
 public:
  explicit Resize(int64_t size);
  Resize(int64_t height, int64_t width);
  Tensor apply(const Tensor& input, SampleRng& rng) const override;

 private:
  int64_t height_, width_;  // height_ == -1: shorter side to width_
};

// The central height x width window (zero padded where the image is smaller).
class CenterCrop : public Transform {
 public:
  CenterCrop(int64_t height, int64_t width);
  Tensor apply(const Tensor& input, SampleRng& rng) const override;

 private:
  int64_t height_, width_;
};

class ToTensor : public Transform {
 public:
  Tensor apply(const Tensor& input, SampleRng& rng) const override;
};

class Normalize : public Transform {
 public:
  Normalize(std::vector<float> mean, std::vector<float> std);
  Tensor apply(const Tensor& input, SampleRng& rng) const override;

 private:
  std::vector<float> mean_, std_;
};

// Applies its transforms in order, all drawing from the same SampleRng.
class Compose : public Transform {
 public:
  explicit Compose(std::vector<std::shared_ptr<const Transform>> transforms);
  Tensor apply(const Tensor& input, SampleRng& rng) const override;

 private:
  std::vector<std::shared_ptr<const Transform>> transforms_;
};

}  // namespace ember::data
