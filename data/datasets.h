// The datasets ember reads: CIFAR-10/100 (binary version), MNIST and Fashion-MNIST (idx
// files, gzip-compressed or raw) and image folders (PNG, JPEG, BMP via stb_image).
//
// Images come out as u8 [H, W, C] and targets as class indices, as torchvision's datasets
// give them; CIFAR and MNIST are read into memory whole at construction, image folders
// decode one file per get(). Every problem with the files (missing, truncated, wrong magic
// number, wrong record size, label out of range, undecodable image) is an ember::Error that
// names the file and what is wrong with it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dataset.h"

namespace ember::data {

enum class Split { kTrain, kTest };

// CIFAR-10, binary version. `root` is the folder holding cifar-10-batches-bin/ (the
// archive's top folder), or that folder itself. Train: data_batch_1..5.bin (50,000
// images); test: test_batch.bin (10,000). Each record is 1 label byte and 3,072 pixel
// bytes (1,024 red, then green, then blue, each 32x32 row-major).
class Cifar10 : public Dataset {
 public:
  static constexpr int64_t kNumClasses = 10;
  static constexpr const char* kUrl = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz";

  Cifar10(const std::string& root, Split split);
  int64_t size() const override { return images_.size(0); }
  Example get(int64_t index) const override;
  const Tensor& images() const { return images_; }  // [N, 32, 32, 3] u8
  const std::vector<int64_t>& targets() const { return targets_; }
  static const std::vector<std::string>& classes();  // "airplane", ..., "truck"

 private:
  Tensor images_;
  std::vector<int64_t> targets_;
};

// CIFAR-100, binary version: `root` holds cifar-100-binary/ (or is it); train.bin (50,000)
// and test.bin (10,000). Each record is a coarse label byte (20 superclasses), a fine label
// byte (100 classes) and 3,072 pixel bytes laid out as CIFAR-10's.
class Cifar100 : public Dataset {
 public:
  enum class Label { kFine, kCoarse };
  static constexpr int64_t kNumFineClasses = 100;
  static constexpr int64_t kNumCoarseClasses = 20;

  // get() returns the fine or the coarse label as its target, as `label` says.
  Cifar100(const std::string& root, Split split, Label label = Label::kFine);
  int64_t size() const override { return images_.size(0); }
  Example get(int64_t index) const override;
  const Tensor& images() const { return images_; }  // [N, 32, 32, 3] u8
  const std::vector<int64_t>& fine_targets() const { return fine_; }
  const std::vector<int64_t>& coarse_targets() const { return coarse_; }

 private:
  Tensor images_;
  std::vector<int64_t> fine_, coarse_;
  Label label_;
};

// MNIST-format idx files in `root`: train-images-idx3-ubyte and train-labels-idx1-ubyte
// (or t10k-... for the test split), each optionally gzip-compressed (name + ".gz").
class Mnist : public Dataset {
 public:
  static constexpr int64_t kNumClasses = 10;

  Mnist(const std::string& root, Split split);
  int64_t size() const override { return images_.size(0); }
  Example get(int64_t index) const override;
  const Tensor& images() const { return images_; }  // [N, 28, 28, 1] u8
  const std::vector<int64_t>& targets() const { return targets_; }

 protected:
  // `name` heads error messages; `how_to_get` tells the user where the files come from.
  Mnist(const std::string& root, Split split, const char* name, const std::string& how_to_get);

 private:
  Tensor images_;
  std::vector<int64_t> targets_;
};

// Fashion-MNIST: Zalando's clothing images in MNIST's format. Debian's dataset-fashion-mnist
// package installs it at kDefaultRoot, which makes it ember's built-in dataset: no download.
class FashionMnist : public Mnist {
 public:
  static constexpr const char* kDefaultRoot = "/usr/share/datasets/fashion-mnist";

  explicit FashionMnist(Split split, const std::string& root = kDefaultRoot);
  static const std::vector<std::string>& classes();  // "T-shirt/top", ..., "Ankle boot"
};

// Images in root/<class>/**/<file>, as torchvision's ImageFolder: classes are the
// subfolders sorted by name (target = position), files are found recursively and sorted by
// path, and only the given extensions (compared case-insensitively) are taken.
struct ImageFolderOptions {
  int channels = 3;  // 1 (grey), 3 (RGB) or 4 (RGBA): every image is converted to this
  std::vector<std::string> extensions = {".png", ".jpg", ".jpeg", ".bmp"};
};

class ImageFolder : public Dataset {
 public:
  explicit ImageFolder(const std::string& root, ImageFolderOptions options = {});
  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  // Decodes the file: [H, W, channels] u8, the size it has on disk.
  Example get(int64_t index) const override;
  const std::vector<std::string>& classes() const { return classes_; }
  // (path, target) of every image, in index order.
  const std::vector<std::pair<std::string, int64_t>>& samples() const { return samples_; }

 private:
  // Fills classes_ and samples_; names the class folders without images.
  void scan(const std::string& root, const std::vector<std::string>& extensions,
            std::vector<std::string>& empty_classes);
  std::vector<std::string> classes_;
  std::vector<std::pair<std::string, int64_t>> samples_;
  int channels_;
};

// Reads an idx file (raw or gzip-compressed) of u8 elements: a tensor with the file's dims.
Tensor read_idx(const std::string& path);
// Decodes a PNG, JPEG or BMP file to [H, W, channels] u8 (channels 1, 3 or 4).
Tensor decode_image(const std::string& path, int channels = 3);

}  // namespace ember::data
