#include <cstdio>
#include <cstring>
#include <filesystem>

#include <ember/tensor/error.h>
#include <ember/tensor/ops.h>

#include "datasets.h"
#include "detail/io.h"

namespace ember::data {
namespace {

uint32_t big_endian_u32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

std::string hex32(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08x", value);
  return text;
}

Tensor parse_idx(const std::vector<uint8_t>& bytes, const std::string& path) {
  const char* op = "read_idx";
  EMBER_CHECK(bytes.size() >= 4, op, "'", path, "' is truncated: ", bytes.size(),
              " bytes, shorter than the 4-byte idx magic number");
  const uint32_t magic = big_endian_u32(bytes.data());
  EMBER_CHECK(bytes[0] == 0 && bytes[1] == 0 && bytes[3] >= 1, op, "'", path,
              "' has wrong magic number ", hex32(magic),
              ": not an idx file (expected 0x000008NN, e.g. 0x00000803 for images)");
  EMBER_CHECK(bytes[2] == 0x08, op, "'", path, "' has magic number ", hex32(magic),
              ": element type ", hex32(bytes[2]),
              " is not supported (ember reads u8 idx files, type 0x08)");
  const size_t ndim = bytes[3];
  const size_t header = 4 + 4 * ndim;
  EMBER_CHECK(bytes.size() >= header, op, "'", path, "' is truncated: ", bytes.size(),
              " bytes, shorter than the ", header, "-byte header of a ", ndim, "-d idx file");
  Shape dims;
  const size_t data_bytes = bytes.size() - header;
  size_t expected = 1;
  bool too_large = false;
  for (size_t d = 0; d < ndim; ++d) {
    const uint32_t size = big_endian_u32(bytes.data() + 4 + 4 * d);
    dims.push_back(size);
    // Stop multiplying before the product overflows: the file is then too short anyway.
    if (!too_large) {
      if (size != 0 && expected > (size_t{1} << 62) / size) too_large = true;
      expected *= size;
    }
  }
  EMBER_CHECK(!too_large && expected == data_bytes, op, "'", path, "' has ", data_bytes,
              " bytes after its header but its dims ", shape_str(dims), " need ",
              too_large ? std::string("more") : std::to_string(expected),
              data_bytes < expected || too_large ? ": the file is truncated"
                                                 : ": the file has trailing bytes");
  Tensor result = empty(dims, kU8);
  if (data_bytes > 0) std::memcpy(result.data_ptr<uint8_t>(), bytes.data() + header, data_bytes);
  return result;
}

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
  return parse_idx(detail::maybe_gunzip(detail::read_file(path, "read_idx"), path, "read_idx"),
                   path);
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
              " dims (magic number 0x0000080", images.dim(),
              "), but an images file has 3 (0x00000803)");
  EMBER_CHECK(labels.dim() == 1, name, "'", labels_path, "' has ", labels.dim(),
              " dims (magic number 0x0000080", labels.dim(),
              "), but a labels file has 1 (0x00000801)");
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
