#include <filesystem>
#include <new>
#include <utility>

#include <ember/tensor/error.h>
#include <ember/tensor/ops.h>

#include "datasets.h"
#include "detail/io.h"

namespace ember::data {
namespace {

constexpr int64_t kSide = 32;
constexpr int64_t kPixels = kSide * kSide * 3;
// Each CIFAR-10 batch and CIFAR-100's test.bin hold 10,000 images; CIFAR-100's train.bin 50,000.
constexpr int64_t kRecordsPerFile = 10'000;

// The folder holding the binary files: root/<subdir> or root itself.
std::string find_folder(const std::string& root, const std::string& subdir,
                        const std::string& probe, const char* op, const std::string& url) {
  namespace fs = std::filesystem;
  const fs::path nested = fs::path(root) / subdir;
  if (detail::exists_no_throw(nested / probe)) return nested.string();
  if (detail::exists_no_throw(fs::path(root) / probe)) return root;
  throw Error(ember::detail::str_cat(
      op, ": dataset not found: looked for '", (nested / probe).string(), "' and '",
      (fs::path(root) / probe).string(), "'. Download ", url, " and unpack it into '", root,
      "' so that '", nested.string(), "' holds the .bin files (scripts/fetch_cifar10.sh ",
      "<folder> does this for CIFAR-10 and checks the MD5)"));
}

// The records of one binary file (a missing file is named as a partial copy); larger files
// than the dataset's own are refused before reading.
void read_records(const std::string& path, const char* op, const std::vector<int64_t>& limits,
                  int64_t max_records, std::vector<uint8_t>& pixels,
                  std::vector<std::vector<int64_t>>& labels) {
  EMBER_CHECK(detail::exists_no_throw(path), op, "missing file '", path,
              "': the folder looks like a partial copy of the dataset");
  detail::read_cifar_file(path, op, limits, max_records, pixels, labels);
}

Tensor to_images(const std::vector<uint8_t>& pixels, const std::string& folder, const char* op) {
  const int64_t n = static_cast<int64_t>(pixels.size()) / kPixels;
  Tensor images;
  try {
    images = empty({n, kSide, kSide, 3}, kU8);
  } catch (const std::bad_alloc&) {
    throw Error(ember::detail::str_cat(op, ": the ", n, " images in '", folder, "' need ",
                                       pixels.size(),
                                       " bytes, more memory than could be allocated"));
  }
  std::copy(pixels.begin(), pixels.end(), images.data_ptr<uint8_t>());
  return images;
}

}  // namespace

Cifar10::Cifar10(const std::string& root, Split split) {
  const char* op = "CIFAR10";
  const std::string folder = find_folder(root, "cifar-10-batches-bin", "test_batch.bin", op, kUrl);
  std::vector<std::string> files;
  if (split == Split::kTrain) {
    for (int i = 1; i <= 5; ++i) files.push_back("data_batch_" + std::to_string(i) + ".bin");
  } else {
    files.push_back("test_batch.bin");
  }
  std::vector<uint8_t> pixels;
  std::vector<std::vector<int64_t>> labels(1);
  for (const auto& file : files) {
    read_records((std::filesystem::path(folder) / file).string(), op, {kNumClasses},
                 kRecordsPerFile, pixels, labels);
  }
  images_ = to_images(pixels, folder, op);
  targets_ = std::move(labels[0]);
}

Example Cifar10::get(int64_t index) const {
  check_index(index, "CIFAR10::get");
  return {images_.select(0, index), targets_[static_cast<size_t>(index)]};
}

const std::vector<std::string>& Cifar10::classes() {
  static const std::vector<std::string> kClasses = {
      "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"};
  return kClasses;
}

Cifar100::Cifar100(const std::string& root, Split split, Label label) : label_(label) {
  const char* op = "CIFAR100";
  const std::string folder =
      find_folder(root, "cifar-100-binary", "test.bin", op,
                  "https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz");
  const std::string file = split == Split::kTrain ? "train.bin" : "test.bin";
  std::vector<uint8_t> pixels;
  std::vector<std::vector<int64_t>> labels(2);
  read_records((std::filesystem::path(folder) / file).string(), op,
               {kNumCoarseClasses, kNumFineClasses},
               split == Split::kTrain ? 5 * kRecordsPerFile : kRecordsPerFile, pixels, labels);
  images_ = to_images(pixels, folder, op);
  coarse_ = std::move(labels[0]);
  fine_ = std::move(labels[1]);
}

Example Cifar100::get(int64_t index) const {
  check_index(index, "CIFAR100::get");
  const auto& targets = label_ == Label::kFine ? fine_ : coarse_;
  return {images_.select(0, index), targets[static_cast<size_t>(index)]};
}

}  // namespace ember::data
