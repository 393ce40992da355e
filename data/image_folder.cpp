#include <stb/stb_image.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <memory>
#include <system_error>

#include <ember/tensor/error.h>
#include <ember/tensor/ops.h>

#include "datasets.h"
#include "detail/io.h"

namespace ember::data {
namespace {

// Larger images are refused before decoding: 2^28 pixels is 1 GiB of RGBA.
constexpr int64_t kMaxPixels = int64_t{1} << 28;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

Tensor decode_image(const std::string& path, int channels) {
  const char* op = "decode_image";
  EMBER_CHECK(channels == 1 || channels == 3 || channels == 4, op,
              "channels must be 1, 3 or 4, got ", channels);
  const std::vector<uint8_t> bytes = detail::read_file(path, op);
  EMBER_CHECK(bytes.size() <= static_cast<size_t>(INT32_MAX), op, "'", path, "' is too large (",
              bytes.size(), " bytes)");
  const int length = static_cast<int>(bytes.size());
  int width = 0, height = 0, file_channels = 0;
  EMBER_CHECK(stbi_info_from_memory(bytes.data(), length, &width, &height, &file_channels), op,
              "cannot decode '", path, "': ", stbi_failure_reason(),
              " (ember reads PNG, JPEG and BMP)");
  EMBER_CHECK(width > 0 && height > 0 && int64_t{width} * height <= kMaxPixels, op, "'", path,
              "' claims ", width, "x", height, " pixels, more than ember decodes (", kMaxPixels,
              ")");
  std::shared_ptr<void> pixels(
      stbi_load_from_memory(bytes.data(), length, &width, &height, &file_channels, channels),
      [](void* p) { stbi_image_free(p); });
  EMBER_CHECK(pixels != nullptr, op, "cannot decode '", path, "': ", stbi_failure_reason());
  return from_blob(pixels.get(), {height, width, channels}, kU8, kCPU, pixels);
}

void ImageFolder::scan(const std::string& root, const std::vector<std::string>& extensions,
                       std::vector<std::string>& empty_classes) {
  namespace fs = std::filesystem;
  const char* op = "ImageFolder";
  for (const auto& entry : fs::directory_iterator(root)) {
    if (entry.is_directory()) classes_.push_back(entry.path().filename().string());
  }
  std::sort(classes_.begin(), classes_.end());
  EMBER_CHECK(!classes_.empty(), op, "'", root, "' has no class subfolders. Arrange images as ",
              root, "/<class name>/<image file>");
  for (size_t c = 0; c < classes_.size(); ++c) {
    std::vector<std::string> files;
    const auto it_options = fs::directory_options::follow_directory_symlink;
    for (const auto& entry :
         fs::recursive_directory_iterator(fs::path(root) / classes_[c], it_options)) {
      if (!entry.is_regular_file()) continue;
      const std::string ext = lower(entry.path().extension().string());
      if (std::find(extensions.begin(), extensions.end(), ext) != extensions.end()) {
        files.push_back(entry.path().string());
      }
    }
    if (files.empty()) empty_classes.push_back(classes_[c]);
    std::sort(files.begin(), files.end());
    for (auto& f : files) samples_.emplace_back(std::move(f), static_cast<int64_t>(c));
  }
}

ImageFolder::ImageFolder(const std::string& root, ImageFolderOptions options)
    : channels_(options.channels) {
  namespace fs = std::filesystem;
  const char* op = "ImageFolder";
  EMBER_CHECK(channels_ == 1 || channels_ == 3 || channels_ == 4, op,
              "channels must be 1, 3 or 4, got ", channels_);
  std::error_code error;
  EMBER_CHECK(fs::is_directory(root, error), op, "dataset not found: '", root,
              "' is not a folder. Arrange images as ", root, "/<class name>/<image file>");
  for (auto& ext : options.extensions) ext = lower(ext);
  std::vector<std::string> empty_classes;
  try {
    scan(root, options.extensions, empty_classes);
  } catch (const fs::filesystem_error& e) {
    throw Error(ember::detail::str_cat(op, ": cannot list '", root, "': ", e.what()));
  }
  if (!empty_classes.empty()) {
    std::string names, exts;
    for (const auto& n : empty_classes) names += (names.empty() ? "'" : ", '") + n + "'";
    for (const auto& e : options.extensions) exts += (exts.empty() ? "" : " ") + e;
    throw Error(ember::detail::str_cat(op, ": class folder(s) ", names, " under '", root,
                                       "' hold no image files (extensions: ", exts, ")"));
  }
}

Example ImageFolder::get(int64_t index) const {
  check_index(index, "ImageFolder::get");
  const auto& [path, target] = samples_[static_cast<size_t>(index)];
  return {decode_image(path, channels_), target};
}

}  // namespace ember::data
