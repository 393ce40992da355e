#include <cstdio>
#include <cstring>
#include <filesystem>

#include <ember/tensor/error.h>
#include <ember/tensor/ops.h>

#include "datasets.h"
#include "detail/io.h"

namespace ember::data {
namespace {

constexpr int64_t kSide = 28;

std::string hex32(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08x", value);
  return text;
}

// The idx magic number of a u8 file with `ndim` dims, as printed in messages.
std::string idx_magic(int64_t ndim) { return hex32(0x800u | static_cast<uint32_t>(ndim)); }

// root/name or root/name.gz, whichever exists; ember::Error saying how to get the data.
std::string find_idx(const std::string& root, const std::string& name, const char* op,
                     const std::string& how_to_get) {
  namespace fs = std::filesystem;
  const fs::path raw = fs::path(root) / name;
  const fs::path gz = fs::path(root) / (name + ".gz");
  if (detail::exists_no_throw(gz)) return gz.string();
  if (detail::exists_no_throw(raw)) return raw.string();
  throw Error(ember::detail::str_cat(op, ": dataset not found: neither '", gz.string(), "' nor '",
                                     raw.string(), "' exists. ", how_to_get));
}

}  // namespace

Tensor read_idx(const std::string& path) {
  Tensor result;
  detail::read_idx_file(path, "read_idx", [&](const std::vector<int64_t>& dims) {
    result = empty(Shape(dims.begin(), dims.end()), kU8);
    return result.data_ptr<uint8_t>();
  });
  return result;
}

Mnist::Mnist(const std::string& root, Split split)
    : Mnist(root, split, "MNIST",
            "Put the four idx files (from http://yann.lecun.com/exdb/mnist/ or a mirror), "
            "gzip-compressed or not, in that folder.") {}

Mnist::Mnist(const std::string& root, Split split, const char* name,
             const std::string& how_to_get) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string images_path = find_idx(root, prefix + "-images-idx3-ubyte", name, how_to_get);
  const std::string labels_path = find_idx(root, prefix + "-labels-idx1-ubyte", name, how_to_get);
  const auto with_context = [&](const std::string& path, auto read) {
    try {
      return read(path);
    } catch (const Error& e) {
      throw Error(ember::detail::str_cat(name, ": ", e.what()));
    }
  };
  Tensor images = with_context(images_path, read_idx);
  Tensor labels = with_context(labels_path, read_idx);
  EMBER_CHECK(images.dim() == 3, name, "'", images_path, "' has ", images.dim(),
              " dims (magic number ", idx_magic(images.dim()), "), but an images file has 3 (",
              idx_magic(3), ")");
  EMBER_CHECK(labels.dim() == 1, name, "'", labels_path, "' has ", labels.dim(),
              " dims (magic number ", idx_magic(labels.dim()), "), but a labels file has 1 (",
              idx_magic(1), ")");
  // Every MNIST-format dataset (MNIST, Fashion-MNIST, KMNIST, EMNIST) has 28x28 images, and
  // images() promises [N, 28, 28, 1].
  EMBER_CHECK(images.size(1) == kSide && images.size(2) == kSide, name, "'", images_path,
              "' holds ", images.size(1), "x", images.size(2), " images (dims ",
              shape_str(images.sizes()), "), but MNIST-format images are ", kSide, "x", kSide);
  EMBER_CHECK(images.size(0) > 0, name, "'", images_path, "' holds no images (dims ",
              shape_str(images.sizes()), "): the dataset is empty");
  EMBER_CHECK(images.size(0) == labels.size(0), name, "'", images_path, "' holds ", images.size(0),
              " images but '", labels_path, "' holds ", labels.size(0), " labels");
  const uint8_t* label = labels.data_ptr<uint8_t>();
  targets_.resize(static_cast<size_t>(labels.size(0)));
  for (int64_t i = 0; i < labels.size(0); ++i) {
    EMBER_CHECK(label[i] < kNumClasses, name, "'", labels_path, "' label ", i, " is ",
                static_cast<int>(label[i]), ", outside [0, ", kNumClasses, ")");
    targets_[static_cast<size_t>(i)] = label[i];
  }
  images_ = images.unsqueeze(3);
}

Example Mnist::get(int64_t index) const {
  check_index(index, "MNIST::get");
  return {images_.select(0, index), targets_[static_cast<size_t>(index)]};
}

FashionMnist::FashionMnist(Split split, const std::string& root)
    : Mnist(root, split, "FashionMNIST",
            "Install Debian's package (apt-get install dataset-fashion-mnist, which puts it in " +
                std::string(kDefaultRoot) +
                ") or put the four idx files from "
                "https://github.com/zalandoresearch/fashion-mnist in that folder.") {}

const std::vector<std::string>& FashionMnist::classes() {
  static const std::vector<std::string> kClasses = {
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
      "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return kClasses;
}

}  // namespace ember::data
