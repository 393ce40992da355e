// Fuzzing every parser with random truncations and byte flips of valid files: each must
// load or throw ember::Error, never crash or throw anything else. Bounded and seeded, so
// the test is deterministic.
#include <ember/data/datasets.h>

#include <filesystem>
#include <functional>
#include <random>

#include "data_files.h"
#include "test_util.h"

namespace ember::data {
namespace {

using testing::Bytes;
using testing::TempDir;

// Mutations of `valid`: truncation, 1-8 flipped bytes, or both.
Bytes mutate(const Bytes& valid, std::mt19937& rng) {
  Bytes out = valid;
  const int kind = static_cast<int>(rng() % 3);
  if (kind != 1 && !out.empty()) out.resize(rng() % out.size());
  if (kind != 0 && !out.empty()) {
    const int flips = 1 + static_cast<int>(rng() % 8);
    for (int f = 0; f < flips; ++f)
      out[rng() % out.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
  }
  return out;
}

// Writes mutations of `valid` to `path` and runs `parse` on each.
void fuzz(const TempDir& dir, const std::string& relative, const Bytes& valid,
          const std::function<void(const std::string&)>& parse, int iterations = 250) {
  std::mt19937 rng(1234);
  int errors = 0;
  for (int i = 0; i < iterations; ++i) {
    const std::string path = dir.write(relative, mutate(valid, rng));
    try {
      parse(path);
    } catch (const Error& e) {
      ++errors;
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos)
          << "error does not name the file: " << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << relative << " iteration " << i << ": not an ember::Error: " << e.what();
    }
  }
  EXPECT_GT(errors, 0) << relative << ": no mutation was detected";
}

TEST(Fuzz, CifarParsers) {
  TempDir dir;
  fuzz(dir, "cifar-10-batches-bin/test_batch.bin", testing::cifar_records({{1}, {2}, {9}}, 0),
       [&](const std::string&) { Cifar10(dir.path(), Split::kTest); });
  fuzz(dir, "cifar-100-binary/test.bin", testing::cifar_records({{1, 50}, {19, 99}}, 0),
       [&](const std::string&) { Cifar100(dir.path(), Split::kTest); });
}

TEST(Fuzz, IdxRawAndGzip) {
  TempDir dir;
  Bytes pixels(3 * 28 * 28);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i);
  const Bytes images = testing::idx({3, 28, 28}, pixels);
  const Bytes labels = testing::idx({3}, {0, 5, 9});
  dir.write("train-labels-idx1-ubyte", labels);
  fuzz(dir, "train-images-idx3-ubyte", images,
       [&](const std::string&) { Mnist(dir.path(), Split::kTrain); });
  TempDir gz;
  gz.write("t10k-images-idx3-ubyte.gz", testing::gzip(images));
  fuzz(gz, "t10k-labels-idx1-ubyte.gz", testing::gzip(labels),
       [&](const std::string&) { Mnist(gz.path(), Split::kTest); });
  fuzz(gz, "any.idx.gz", testing::gzip(images), [](const std::string& p) { read_idx(p); });
}

TEST(Fuzz, RealDeflateStreamFromFashionMnist) {
  // Huffman-coded deflate exercises more of the inflater than stored blocks.
  const std::string labels = std::string(FashionMnist::kDefaultRoot) + "/t10k-labels-idx1-ubyte.gz";
  if (!std::filesystem::exists(labels)) GTEST_SKIP() << "apt-get install dataset-fashion-mnist";
  TempDir dir;
  fuzz(
      dir, "labels.gz", testing::read_bytes(labels), [](const std::string& p) { read_idx(p); },
      150);
}

TEST(Fuzz, ImageDecoders) {
  TempDir dir;
  Bytes hwc(6 * 5 * 3);
  for (size_t i = 0; i < hwc.size(); ++i) hwc[i] = static_cast<uint8_t>(i * 11);
  const auto decode = [](const std::string& p) { decode_image(p, 3); };
  fuzz(dir, "a.png", testing::png(6, 5, 3, hwc), decode);
  fuzz(dir, "a.bmp", testing::bmp(6, 5, hwc), decode);
  fuzz(dir, "a.jpg", testing::jpeg_8x8(), decode);
}

}  // namespace
}  // namespace ember::data
