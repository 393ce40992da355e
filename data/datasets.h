// The datasets ember reads: CIFAR-10/100 (binary version), MNIST and Fashion-MNIST (idx
// files, gzip-compressed or raw) and image folders (PNG, JPEG and BMP only).
//
// Images come out as u8 [H, W, C] and targets as class indices, as torchvision's datasets
// give them; CIFAR and MNIST are read into memory whole at construction, image folders
// decode one file per get(). Every problem with the files (missing, not a regular file,
// truncated, wrong magic number, wrong record size, label out of range, undecodable or
// oversized image, a gzip stream inflating past its header's size) is an ember::Error that
// names the file and what is wrong with it, raised before memory is allocated for what a
// corrupt header claims.
//
// Images are decoded by libpng (PNG), libjpeg (JPEG) and ember's own checked BMP reader
// (uncompressed 8-, 24- and 32-bit, bottom-up or top-down): the format is recognised by its
// magic bytes, and any other (GIF, PGM, TGA, HDR, PSD, ...) is refused by name. libpng and
// libjpeg are the reference decoders and report truncation, checksum mismatches and broken
// entropy-coded data as errors, where a catch-all decoder would zero-fill missing pixels.
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

// Images larger than this are refused before decoding: PIL's default limit
// (Image.MAX_IMAGE_PIXELS, about 9459 x 9459), 256 MiB of RGB.
constexpr int64_t kDefaultMaxImagePixels = 89'478'485;

// Images in root/<class>/**/<file>, as torchvision's ImageFolder: classes are the
// subfolders sorted by name (target = position), files are found recursively and sorted by
// path, and only the given extensions (compared case-insensitively) are taken. Only regular
// files (and links to them) are taken; FIFOs, devices and sockets are skipped. Links to
// folders outside the dataset are followed; a link to a folder that leads back into the
// dataset (`cat/sub/loop -> ..`, a link to the root, `kitten -> cat`) or to a folder holding
// the link (a loop) is an ember::Error naming the link and where it leads, never followed
// into reading the same images again. skip_bad_files (--bad-images skip) does not skip such a
// link: it leaves out files that do not decode, while a link back in is the layout's error.
struct ImageFolderOptions {
  int channels = 3;  // 1 (grey), 3 (RGB) or 4 (RGBA): every image is converted to this
  std::vector<std::string> extensions = {".png", ".jpg", ".jpeg", ".bmp"};
  // Images claiming more pixels than this are errors (named, with the size they claim).
  int64_t max_pixels = kDefaultMaxImagePixels;
  // false: a bad file is an ember::Error when get() reaches it. true: the constructor decodes
  // every file once (a full pass over the data) and leaves out those that fail, listing them
  // in bad_files(); indices then count only the good files.
  bool skip_bad_files = false;
};

class ImageFolder : public Dataset {
 public:
  // A file that failed to decode and was left out (skip_bad_files), with the reason.
  struct BadFile {
    std::string path;
    std::string reason;  // the ember::Error's message
  };

  explicit ImageFolder(const std::string& root, ImageFolderOptions options = {});
  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  // Decodes the file: [H, W, channels] u8, the size it has on disk.
  Example get(int64_t index) const override;
  // The file's path, for error messages (the DataLoader's collate errors).
  std::string describe(int64_t index) const override;
  const std::vector<std::string>& classes() const { return classes_; }
  // (path, target) of every image, in index order.
  const std::vector<std::pair<std::string, int64_t>>& samples() const { return samples_; }
  // The files left out with skip_bad_files, in path order (empty otherwise).
  const std::vector<BadFile>& bad_files() const { return bad_files_; }

 private:
  // Fills classes_ and samples_; names the class folders without images.
  void scan(const std::string& root, const std::vector<std::string>& extensions,
            std::vector<std::string>& empty_classes);
  std::vector<std::string> classes_;
  std::vector<std::pair<std::string, int64_t>> samples_;
  std::vector<BadFile> bad_files_;
  int channels_;
  int64_t max_pixels_;
};

// Reads an idx file (raw or gzip-compressed) of u8 elements: a tensor with the file's dims.
// Gzip streams are inflated only as far as the header's dims imply.
Tensor read_idx(const std::string& path);
// Decodes a PNG, JPEG or BMP file (recognised by its magic bytes, not its name) to
// [H, W, channels] u8, channels 1, 3 or 4 (converted as PIL's Image.convert). 8-bit output:
// 16-bit PNGs keep their high byte. Images over max_pixels pixels are refused before
// decoding.
Tensor decode_image(const std::string& path, int channels = 3,
                    int64_t max_pixels = kDefaultMaxImagePixels);

}  // namespace ember::data
