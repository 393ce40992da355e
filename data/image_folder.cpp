#include <algorithm>
#include <cctype>
#include <climits>
#include <filesystem>
#include <memory>
#include <system_error>

#include <ember/tensor/error.h>
#include <ember/tensor/ops.h>

#include "datasets.h"
#include "detail/image.h"
#include "detail/io.h"

namespace ember::data {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// Whether `path` is `folder` or lies inside it (both canonical).
bool lies_within(const std::filesystem::path& path, const std::filesystem::path& folder) {
  return std::mismatch(folder.begin(), folder.end(), path.begin(), path.end()).first ==
         folder.end();
}

// ember::Error when `link`, a symbolic link to a folder met while listing the dataset at
// `root` (canonical), leads back into the dataset or to a folder that holds the link (a loop):
// following it would read the same images again.
void refuse_looping_link(const std::filesystem::path& link, const std::filesystem::path& root) {
  namespace fs = std::filesystem;
  const fs::path target = fs::canonical(link);
  const fs::path parent = fs::canonical(link.parent_path());
  const bool into_dataset = lies_within(target, root);
  EMBER_CHECK(!into_dataset && !lies_within(parent, target), "ImageFolder", "the symbolic link '",
              link.string(), "' leads to '", target.string(), "', ",
              into_dataset ? "inside the dataset '" + root.string() + "'"
                           : std::string("a folder that holds the link (a loop)"),
              ": following it would read the same images again. Remove the link, or point it at a "
              "folder outside the dataset");
}

}  // namespace

Tensor decode_image(const std::string& path, int channels, int64_t max_pixels) {
  const char* op = "decode_image";
  EMBER_CHECK(channels == 1 || channels == 3 || channels == 4, op,
              "channels must be 1, 3 or 4, got ", channels);
  EMBER_CHECK(max_pixels > 0, op, "max_pixels must be positive, got ", max_pixels);
  // No PNG, JPEG or BMP of max_pixels pixels needs more than 8 bytes a pixel (16-bit RGBA
  // PNG stored uncompressed) and some metadata.
  const uint64_t max_bytes =
      static_cast<uint64_t>(std::min<int64_t>(max_pixels, INT64_MAX / 16)) * 8 +
      (uint64_t{1} << 26);
  const std::vector<uint8_t> bytes =
      detail::read_file(path, op, max_bytes, ", the most an image of max_pixels pixels can need");
  Tensor image;
  detail::decode_image_bytes(bytes.data(), bytes.size(), path, channels, max_pixels,
                             [&](int64_t height, int64_t width, int c) {
                               image = empty({height, width, c}, kU8);
                               return image.data_ptr<uint8_t>();
                             });
  return image;
}

void ImageFolder::scan(const std::string& root, const std::vector<std::string>& extensions,
                       std::vector<std::string>& empty_classes) {
  namespace fs = std::filesystem;
  const char* op = "ImageFolder";
  const fs::path canonical_root = fs::canonical(root);
  // Links to folders are followed (as torchvision does) unless they lead back into the
  // dataset or loop; links to files are taken as files.
  const auto check_link = [&](const fs::directory_entry& entry) {
    std::error_code kind_error;
    if (entry.is_symlink(kind_error) && entry.is_directory(kind_error))
      refuse_looping_link(entry.path(), canonical_root);
  };
  for (const auto& entry : fs::directory_iterator(root)) {
    if (!entry.is_directory()) continue;
    check_link(entry);
    classes_.push_back(entry.path().filename().string());
  }
  std::sort(classes_.begin(), classes_.end());
  EMBER_CHECK(!classes_.empty(), op, "'", root, "' has no class subfolders. Arrange images as ",
              root, "/<class name>/<image file>");
  for (size_t c = 0; c < classes_.size(); ++c) {
    std::vector<std::string> files;
    const auto it_options = fs::directory_options::follow_directory_symlink;
    for (const auto& entry :
         fs::recursive_directory_iterator(fs::path(root) / classes_[c], it_options)) {
      // Directories are walked; anything else with an image extension is a sample, so that
      // a FIFO or device named like an image is reported (by get()) rather than hidden.
      check_link(entry);
      std::error_code kind_error;
      if (entry.is_directory(kind_error)) continue;
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
    : channels_(options.channels), max_pixels_(options.max_pixels) {
  namespace fs = std::filesystem;
  const char* op = "ImageFolder";
  EMBER_CHECK(channels_ == 1 || channels_ == 3 || channels_ == 4, op,
              "channels must be 1, 3 or 4, got ", channels_);
  EMBER_CHECK(max_pixels_ > 0, op, "max_pixels must be positive, got ", max_pixels_);
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
  if (options.skip_bad_files) {
    std::vector<std::pair<std::string, int64_t>> good;
    for (auto& sample : samples_) {
      try {
        decode_image(sample.first, channels_, max_pixels_);
        good.push_back(std::move(sample));
      } catch (const Error& e) {
        bad_files_.push_back({sample.first, e.what()});
      }
    }
    samples_ = std::move(good);
    EMBER_CHECK(!samples_.empty(), op, "every one of the ", bad_files_.size(),
                " image files under '", root,
                "' failed to decode; the first: ", bad_files_.front().reason);
  }
}

std::string ImageFolder::describe(int64_t index) const {
  if (index < 0 || index >= size()) return {};
  return samples_[static_cast<size_t>(index)].first;
}

Example ImageFolder::get(int64_t index) const {
  check_index(index, "ImageFolder::get");
  const auto& [path, target] = samples_[static_cast<size_t>(index)];
  return {decode_image(path, channels_, max_pixels_), target};
}

}  // namespace ember::data
