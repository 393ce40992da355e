// Dataset readers against files written here in each official layout, the real
// Fashion-MNIST from Debian's package when installed, and every kind of bad input.
#include <ember/data/datasets.h>

#include <algorithm>
#include <filesystem>

#include "data_files.h"
#include "test_util.h"

namespace ember::data {
namespace {

using testing::Bytes;
using testing::TempDir;

// Checks that `images` [N, 32, 32, 3] holds test_pixel(first + n, c, y, x) at [n, y, x, c].
void expect_cifar_pixels(const Tensor& images, int64_t first) {
  ASSERT_EQ(images.sizes(), (Shape{images.size(0), 32, 32, 3}));
  const uint8_t* p = images.contiguous().data_ptr<uint8_t>();
  for (int64_t n = 0; n < images.size(0); ++n)
    for (int64_t y = 0; y < 32; ++y)
      for (int64_t x = 0; x < 32; ++x)
        for (int64_t c = 0; c < 3; ++c)
          ASSERT_EQ(p[((n * 32 + y) * 32 + x) * 3 + c], testing::test_pixel(first + n, c, y, x))
              << "image " << n << " y " << y << " x " << x << " c " << c;
}

// CIFAR-10 train split spread over the five batch files (3, 2, 2, 2 and 1 records), plus a
// 2-record test file.
void write_cifar10(const TempDir& dir, const std::string& folder = "cifar-10-batches-bin") {
  const int counts[5] = {3, 2, 2, 2, 1};
  int64_t image = 0;
  for (int b = 0; b < 5; ++b) {
    std::vector<std::vector<uint8_t>> labels;
    for (int r = 0; r < counts[b]; ++r) labels.push_back({static_cast<uint8_t>((image + r) % 10)});
    dir.write(folder + "/data_batch_" + std::to_string(b + 1) + ".bin",
              testing::cifar_records(labels, image));
    image += counts[b];
  }
  dir.write(folder + "/test_batch.bin", testing::cifar_records({{9}, {4}}, 100));
}

TEST(Cifar10, ReadsTrainAndTestSplitsInOrderAsHwc) {
  TempDir dir;
  write_cifar10(dir);
  Cifar10 train(dir.path(), Split::kTrain);
  ASSERT_EQ(train.size(), 10);
  expect_cifar_pixels(train.images(), 0);
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(train.targets()[static_cast<size_t>(i)], i % 10);
  const Example e = train.get(7);
  EXPECT_EQ(e.target, 7);
  EXPECT_EQ(e.data.sizes(), (Shape{32, 32, 3}));
  EXPECT_EQ(e.data.dtype(), kU8);
  EXPECT_EQ(e.data.data_ptr<uint8_t>()[(5 * 32 + 6) * 3 + 2], testing::test_pixel(7, 2, 5, 6));

  Cifar10 test(dir.path(), Split::kTest);
  ASSERT_EQ(test.size(), 2);
  expect_cifar_pixels(test.images(), 100);
  EXPECT_EQ(test.targets(), (std::vector<int64_t>{9, 4}));
  EXPECT_EQ(Cifar10::classes().size(), 10u);
  EXPECT_EQ(Cifar10::classes()[9], "truck");
  EXPECT_EMBER_ERROR(test.get(2), "index 2 is out of range");
}

TEST(Cifar10, AcceptsTheBatchesFolderItselfAsRoot) {
  TempDir dir;
  write_cifar10(dir, "unpacked");
  Cifar10 test(dir.path() + "/unpacked", Split::kTest);
  EXPECT_EQ(test.size(), 2);
}

TEST(Cifar100, ReadsFineAndCoarseLabels) {
  TempDir dir;
  dir.write("cifar-100-binary/train.bin", testing::cifar_records({{3, 99}, {19, 0}, {0, 42}}, 5));
  dir.write("cifar-100-binary/test.bin", testing::cifar_records({{7, 7}}, 0));
  Cifar100 fine(dir.path(), Split::kTrain);
  ASSERT_EQ(fine.size(), 3);
  expect_cifar_pixels(fine.images(), 5);
  EXPECT_EQ(fine.fine_targets(), (std::vector<int64_t>{99, 0, 42}));
  EXPECT_EQ(fine.coarse_targets(), (std::vector<int64_t>{3, 19, 0}));
  EXPECT_EQ(fine.get(0).target, 99);
  Cifar100 coarse(dir.path(), Split::kTrain, Cifar100::Label::kCoarse);
  EXPECT_EQ(coarse.get(1).target, 19);
  EXPECT_EQ(Cifar100(dir.path(), Split::kTest).size(), 1);
}

Bytes mnist_images(uint32_t n) {
  Bytes pixels;
  for (uint32_t i = 0; i < n; ++i)
    for (int y = 0; y < 28; ++y)
      for (int x = 0; x < 28; ++x) pixels.push_back(testing::test_pixel(i, 0, y, x));
  return testing::idx({n, 28, 28}, pixels);
}

void expect_mnist(const Mnist& m, const std::vector<int64_t>& labels) {
  ASSERT_EQ(m.size(), static_cast<int64_t>(labels.size()));
  EXPECT_EQ(m.targets(), labels);
  ASSERT_EQ(m.images().sizes(), (Shape{m.size(), 28, 28, 1}));
  const Example e = m.get(m.size() - 1);
  EXPECT_EQ(e.data.sizes(), (Shape{28, 28, 1}));
  EXPECT_EQ(e.target, labels.back());
  const Tensor img = e.data.contiguous();
  EXPECT_EQ(img.data_ptr<uint8_t>()[13 * 28 + 17], testing::test_pixel(m.size() - 1, 0, 13, 17));
}

TEST(Mnist, ReadsRawAndGzipIdxFiles) {
  TempDir raw;
  raw.write("train-images-idx3-ubyte", mnist_images(3));
  raw.write("train-labels-idx1-ubyte", testing::idx({3}, {5, 0, 9}));
  raw.write("t10k-images-idx3-ubyte", mnist_images(1));
  raw.write("t10k-labels-idx1-ubyte", testing::idx({1}, {2}));
  expect_mnist(Mnist(raw.path(), Split::kTrain), {5, 0, 9});
  expect_mnist(Mnist(raw.path(), Split::kTest), {2});

  TempDir gz;  // gzip-compressed, and Fashion-MNIST reads the same layout
  gz.write("train-images-idx3-ubyte.gz", testing::gzip(mnist_images(4)));
  gz.write("train-labels-idx1-ubyte.gz", testing::gzip(testing::idx({4}, {1, 2, 3, 4})));
  expect_mnist(FashionMnist(Split::kTrain, gz.path()), {1, 2, 3, 4});
  EXPECT_EQ(FashionMnist::classes()[9], "Ankle boot");
}

TEST(ReadIdx, KeepsTheFileDimsAndJoinsGzipMembers) {
  TempDir dir;
  Bytes data(2 * 3 * 4);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 5);
  const Bytes file = testing::idx({2, 3, 4}, data);
  // Two gzip members: the first holds the header and part of the data.
  Bytes two = testing::gzip(Bytes(file.begin(), file.begin() + 20));
  const Bytes rest = testing::gzip(Bytes(file.begin() + 20, file.end()));
  two.insert(two.end(), rest.begin(), rest.end());
  for (const auto& bytes : {file, testing::gzip(file), two}) {
    const Tensor t = read_idx(dir.write("a.idx", bytes));
    EXPECT_EQ(t.sizes(), (Shape{2, 3, 4}));
    EXPECT_EQ(t.to_vector<uint8_t>(), std::vector<uint8_t>(data.begin(), data.end()));
  }
  EXPECT_EQ(read_idx(dir.write("empty.idx", testing::idx({0, 28}, {}))).sizes(), (Shape{0, 28}));
}

Bytes rgb_pattern(int w, int h) {
  Bytes hwc;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) hwc.push_back(testing::test_pixel(0, c, y, x));
  return hwc;
}

TEST(DecodeImage, ReadsPngBmpAndJpeg) {
  TempDir dir;
  const Bytes hwc = rgb_pattern(5, 3);
  for (const auto& path : {dir.write("a.png", testing::png(5, 3, 3, hwc)),
                           dir.write("a.bmp", testing::bmp(5, 3, hwc))}) {
    const Tensor img = decode_image(path);
    ASSERT_EQ(img.sizes(), (Shape{3, 5, 3})) << path;
    EXPECT_EQ(img.to_vector<uint8_t>(), std::vector<uint8_t>(hwc.begin(), hwc.end())) << path;
  }
  // Grey PNG to 1 and to 3 channels.
  const Bytes grey = {0, 50, 100, 150, 200, 250};
  const std::string grey_path = dir.write("g.png", testing::png(3, 2, 1, grey));
  EXPECT_EQ(decode_image(grey_path, 1).to_vector<uint8_t>(),
            std::vector<uint8_t>(grey.begin(), grey.end()));
  const Tensor grey3 = decode_image(grey_path, 3);
  EXPECT_EQ(grey3.sizes(), (Shape{2, 3, 3}));
  EXPECT_EQ(grey3.to_vector<int64_t>()[3 * 4 + 2], 200);  // pixel (1, 1), blue

  const Tensor jpg = decode_image(dir.write("c.jpg", testing::jpeg_8x8()));
  ASSERT_EQ(jpg.sizes(), (Shape{8, 8, 3}));
  const auto v = jpg.to_vector<int64_t>();
  for (size_t i = 0; i < v.size(); i += 3) {
    EXPECT_NEAR(v[i], 200, 3);
    EXPECT_NEAR(v[i + 1], 30, 3);
    EXPECT_NEAR(v[i + 2], 90, 3);
  }
  EXPECT_EMBER_ERROR(decode_image(grey_path, 2), "channels must be 1, 3 or 4, got 2");
}

TEST(ImageFolder, ClassesSortedFilesRecursiveAndSorted) {
  TempDir dir;
  const Bytes hwc = rgb_pattern(4, 4);
  dir.write("dog/b.png", testing::png(4, 4, 3, hwc));
  dir.write("dog/A.BMP", testing::bmp(4, 4, hwc));
  dir.write("cat/nested/z.png", testing::png(4, 4, 3, hwc));
  dir.write("cat/notes.txt", {'h', 'i'});
  ImageFolder folder(dir.path());
  EXPECT_EQ(folder.classes(), (std::vector<std::string>{"cat", "dog"}));
  ASSERT_EQ(folder.size(), 3);
  EXPECT_EQ(folder.samples()[0].first, dir.path() + "/cat/nested/z.png");
  EXPECT_EQ(folder.samples()[1].first, dir.path() + "/dog/A.BMP");
  EXPECT_EQ(folder.samples()[2].first, dir.path() + "/dog/b.png");
  const Example e = folder.get(1);
  EXPECT_EQ(e.target, 1);
  EXPECT_EQ(e.data.to_vector<uint8_t>(), std::vector<uint8_t>(hwc.begin(), hwc.end()));
  EXPECT_EQ(folder.get(0).target, 0);

  ImageFolderOptions grey;
  grey.channels = 1;
  grey.extensions = {".png"};
  ImageFolder only_png(dir.path(), grey);
  EXPECT_EQ(only_png.size(), 2);
  EXPECT_EQ(only_png.get(1).data.sizes(), (Shape{4, 4, 1}));
}

// Links inside an image folder: to files and to folders outside the dataset they are read
// (as torchvision's os.walk(followlinks=True) does); a link that leads back into the dataset,
// or a loop, is refused by name instead of reading the same images again.
TEST(ImageFolder, FollowsLinksOutOfTheDatasetAndRefusesLinksBackIntoIt) {
  namespace fs = std::filesystem;
  TempDir dir, outside;
  const Bytes one = testing::png(1, 1, 1, {9});
  for (int i = 0; i < 5; ++i) {
    dir.write("images/cat/" + std::to_string(i) + ".png", one);
    dir.write("images/dog/" + std::to_string(i) + ".png", one);
  }
  const std::string root = dir.path() + "/images";
  ASSERT_EQ(ImageFolder(root).size(), 10);
  // Working links: a folder and a file outside the dataset.
  outside.write("more/a.png", one);
  outside.write("more/b.png", one);
  const std::string lone = outside.write("lone.png", one);
  fs::create_directory_symlink(outside.path() + "/more", root + "/cat/more");
  fs::create_symlink(lone, root + "/dog/lone.png");
  {
    ImageFolder folder(root);
    ASSERT_EQ(folder.size(), 13);
    EXPECT_EQ(folder.samples()[0].first, root + "/cat/0.png");
    EXPECT_EQ(folder.samples()[5].first, root + "/cat/more/a.png");
    EXPECT_EQ(folder.samples()[6], std::make_pair(root + "/cat/more/b.png", int64_t{0}));
    EXPECT_EQ(folder.samples()[12], std::make_pair(root + "/dog/lone.png", int64_t{1}));
    EXPECT_EQ(folder.get(12).data.to_vector<uint8_t>(), (std::vector<uint8_t>{9, 9, 9}));
  }
  const std::string cat = fs::canonical(root + "/cat").string();
  const std::string canonical_root = fs::canonical(root).string();
  const auto refused = [&](const std::string& link, const std::string& target,
                           const std::string& why) {
    EXPECT_EMBER_ERROR(ImageFolder{root}, "ImageFolder: the symbolic link '" + link +
                                              "' leads to '" + target + "', " + why +
                                              ": following it would read the same images again");
    ImageFolderOptions skip;
    skip.skip_bad_files = true;  // not a bad file: refused all the same
    EXPECT_EMBER_ERROR((ImageFolder{root, skip}), "the symbolic link '" + link + "'");
    fs::remove(link);
    EXPECT_EQ(ImageFolder(root).size(), 13);
  };
  const std::string inside = "inside the dataset '" + canonical_root + "'";
  // cat/sub/loop -> .. : a loop inside a class folder.
  fs::create_directories(root + "/cat/sub");
  fs::create_directory_symlink("..", root + "/cat/sub/loop");
  refused(root + "/cat/sub/loop", cat, inside);
  // A link to the dataset's root, and one class folder under another name.
  fs::create_directory_symlink(root, root + "/cat/all");
  refused(root + "/cat/all", canonical_root, inside);
  fs::create_directory_symlink("cat", root + "/kitten");
  refused(root + "/kitten", cat, inside);
  // A loop outside the dataset, reached through a link that is fine by itself.
  fs::create_directory_symlink(outside.path(), outside.path() + "/more/up");
  refused(root + "/cat/more/up", fs::canonical(outside.path()).string(),
          "a folder that holds the link (a loop)");
}

// --- bad input ------------------------------------------------------------------------

TEST(BadInput, MissingDatasetsNameThePathAndHowToGetThem) {
  TempDir dir;
  const std::string nowhere = dir.path() + "/nowhere";
  EXPECT_EMBER_ERROR(Cifar10(nowhere, Split::kTrain),
                     nowhere + "/cifar-10-batches-bin/test_batch.bin");
  EXPECT_EMBER_ERROR(Cifar10(nowhere, Split::kTrain), "cifar-10-binary.tar.gz");
  EXPECT_EMBER_ERROR(Cifar10(nowhere, Split::kTrain), "scripts/fetch_cifar10.sh");
  EXPECT_EMBER_ERROR(Cifar100(nowhere, Split::kTest), "cifar-100-binary.tar.gz");
  EXPECT_EMBER_ERROR(Mnist(nowhere, Split::kTrain), nowhere + "/train-images-idx3-ubyte.gz");
  EXPECT_EMBER_ERROR(FashionMnist(Split::kTest, nowhere), nowhere + "/t10k-images-idx3-ubyte");
  EXPECT_EMBER_ERROR(FashionMnist(Split::kTest, nowhere), "apt-get install dataset-fashion-mnist");
  EXPECT_EMBER_ERROR(ImageFolder{nowhere}, std::string("'") + nowhere + "' is not a folder");
  EXPECT_EMBER_ERROR(decode_image(nowhere + "/x.png"), "cannot open '" + nowhere + "/x.png'");
  EXPECT_EMBER_ERROR(read_idx(nowhere + "/x.idx"), "cannot open");

  // A CIFAR-10 folder with a batch file missing.
  write_cifar10(dir);
  std::filesystem::remove(dir.path() + "/cifar-10-batches-bin/data_batch_3.bin");
  EXPECT_EMBER_ERROR(Cifar10(dir.path(), Split::kTrain),
                     "missing file '" + dir.path() + "/cifar-10-batches-bin/data_batch_3.bin'");
}

TEST(BadInput, CifarWrongRecordSizesAndLabels) {
  TempDir dir;
  write_cifar10(dir);
  const std::string test_file = dir.path() + "/cifar-10-batches-bin/test_batch.bin";
  Bytes bytes = testing::read_bytes(test_file);
  Bytes truncated(bytes.begin(), bytes.end() - 1);
  dir.write("cifar-10-batches-bin/test_batch.bin", truncated);
  EXPECT_EMBER_ERROR(
      Cifar10(dir.path(), Split::kTest),
      std::string("'") + test_file + "' has 6,145 bytes, not a whole number of 3073-byte records");
  dir.write("cifar-10-batches-bin/test_batch.bin", {});
  EXPECT_EMBER_ERROR(Cifar10(dir.path(), Split::kTest), "has 0 bytes");
  bytes[3073] = 10;  // second record's label
  dir.write("cifar-10-batches-bin/test_batch.bin", bytes);
  EXPECT_EMBER_ERROR(Cifar10(dir.path(), Split::kTest),
                     std::string("'") + test_file + "' record 1 has label 10, outside [0, 10)");
  // A CIFAR-100 file read as CIFAR-10 (3074-byte records) is refused, and vice versa.
  dir.write("c100/cifar-100-binary/test.bin", testing::cifar_records({{1, 100}}, 0));
  EXPECT_EMBER_ERROR(Cifar100(dir.path() + "/c100", Split::kTest),
                     "has label 100, outside [0, 100)");
  dir.write("c100/cifar-100-binary/test.bin", testing::cifar_records({{20, 1}}, 0));
  EXPECT_EMBER_ERROR(Cifar100(dir.path() + "/c100", Split::kTest), "has label 20, outside [0, 20)");
  dir.write("c100/cifar-100-binary/test.bin", testing::cifar_records({{1}, {2}}, 0));
  EXPECT_EMBER_ERROR(Cifar100(dir.path() + "/c100", Split::kTest), "3074-byte records");
}

TEST(BadInput, IdxWrongMagicTruncationAndTrailingBytes) {
  TempDir dir;
  const Bytes good = testing::idx({2, 2}, {1, 2, 3, 4});
  Bytes magic = good;
  magic[0] = 0x1f;
  EXPECT_EMBER_ERROR(read_idx(dir.write("m.idx", magic)), "has wrong magic number 0x1f000802");
  Bytes type = good;
  type[2] = 0x0d;
  EXPECT_EMBER_ERROR(read_idx(dir.write("t.idx", type)),
                     "element type 0x0000000d is not supported");
  EXPECT_EMBER_ERROR(read_idx(dir.write("s.idx", {0, 0, 8})), "truncated: 3 bytes");
  EXPECT_EMBER_ERROR(read_idx(dir.write("h.idx", Bytes(good.begin(), good.begin() + 10))),
                     "fewer than the 12-byte header");
  EXPECT_EMBER_ERROR(
      read_idx(dir.write("d.idx", Bytes(good.begin(), good.end() - 1))),
      "has 3 bytes after its header but its dims [2, 2] need 4: the file is truncated");
  Bytes trailing = good;
  trailing.push_back(0);
  EXPECT_EMBER_ERROR(read_idx(dir.write("x.idx", trailing)), "the file has trailing bytes");
  // Dims whose product overflows 64 bits.
  EXPECT_EMBER_ERROR(
      read_idx(dir.write("o.idx", testing::idx({0xffffffffu, 0xffffffffu, 0xffffffffu}, {}))),
      "need more than 2^62: the file is truncated");
}

TEST(BadInput, GzipTruncatedOrCorrupt) {
  TempDir dir;
  const Bytes gz = testing::gzip(testing::idx({4}, {1, 2, 3, 4}));
  const std::string cut = dir.write("cut.gz", Bytes(gz.begin(), gz.end() - 12));
  EXPECT_EMBER_ERROR(read_idx(cut), std::string("'") + cut + "' is truncated");
  Bytes bad_len = gz;
  bad_len[12] ^= 0x55;  // the stored block's NLEN no longer complements LEN
  EXPECT_EMBER_ERROR(read_idx(dir.write("bad.gz", bad_len)), "is not valid gzip data");
  Bytes bad_crc = gz;
  bad_crc[bad_crc.size() - 6] ^= 1;
  EXPECT_EMBER_ERROR(read_idx(dir.write("crc.gz", bad_crc)), "is not valid gzip data");
  Bytes garbage = gz;
  garbage.push_back(7);
  EXPECT_EMBER_ERROR(read_idx(dir.write("tail.gz", garbage)),
                     "has trailing bytes after its gzip stream (at byte 35 of 36)");
}

TEST(BadInput, MnistMismatchedFilesAndLabels) {
  TempDir dir;
  dir.write("train-images-idx3-ubyte", mnist_images(2));
  dir.write("train-labels-idx1-ubyte", testing::idx({2}, {1, 10}));
  EXPECT_EMBER_ERROR(
      Mnist(dir.path(), Split::kTrain),
      std::string("'") + dir.path() + "/train-labels-idx1-ubyte' label 1 is 10, outside [0, 10)");
  dir.write("train-labels-idx1-ubyte", testing::idx({3}, {1, 2, 3}));
  EXPECT_EMBER_ERROR(Mnist(dir.path(), Split::kTrain), "holds 2 images but");
  // Files swapped: the labels file's magic number says 1 dim.
  dir.write("train-images-idx3-ubyte", testing::idx({2}, {1, 2}));
  EXPECT_EMBER_ERROR(Mnist(dir.path(), Split::kTrain),
                     "(magic number 0x00000801), but an images file");
  dir.write("train-images-idx3-ubyte", Bytes{0, 0, 8});
  EXPECT_EMBER_ERROR(Mnist(dir.path(), Split::kTrain),
                     "MNIST: read_idx: '" + dir.path() + "/train-images-idx3-ubyte' is truncated");
}

TEST(BadInput, ImageFolderLayoutAndUndecodableImages) {
  TempDir dir;
  dir.write("loose.png", testing::png(1, 1, 1, {7}));
  EXPECT_EMBER_ERROR(ImageFolder{dir.path()}, "has no class subfolders");
  dir.write("a/x.png", testing::png(1, 1, 1, {7}));
  dir.write("b/readme.txt", {'x'});
  EXPECT_EMBER_ERROR(ImageFolder{dir.path()}, "class folder(s) 'b' under");
  dir.write("b/broken.jpg", {0xff, 0xd8, 0xff, 0x00, 1, 2, 3});
  ImageFolder folder(dir.path());
  ASSERT_EQ(folder.size(), 2);
  EXPECT_EQ(folder.get(0).data.to_vector<int64_t>(), (std::vector<int64_t>{7, 7, 7}));
  EXPECT_EMBER_ERROR(folder.get(1),
                     dir.path() + "/b/broken.jpg' is truncated: its JPEG data ends at byte 7");
  // A PNG header claiming an enormous image is refused before decoding.
  Bytes huge = testing::png(1, 1, 1, {7});
  huge[16] = huge[20] = 0x7f;  // width and height ~ 2^31
  EXPECT_EMBER_ERROR(decode_image(dir.write("huge.png", huge)), "huge.png");
}

// --- the real Fashion-MNIST from Debian's dataset-fashion-mnist --------------------------

bool fashion_mnist_installed() {
  return std::filesystem::exists(std::string(FashionMnist::kDefaultRoot) +
                                 "/train-images-idx3-ubyte.gz");
}

uint8_t pixel(const Mnist& m, int64_t index, int64_t y, int64_t x) {
  return m.images().select(0, index).contiguous().data_ptr<uint8_t>()[y * 28 + x];
}

int64_t pixel_sum(const Mnist& m, int64_t index) {
  const auto v = m.get(index).data.to_vector<int64_t>();
  int64_t s = 0;
  for (auto p : v) s += p;
  return s;
}

TEST(FashionMnist, DebianPackageTrainSplit) {
  if (!fashion_mnist_installed()) GTEST_SKIP() << "apt-get install dataset-fashion-mnist";
  FashionMnist train(Split::kTrain);
  ASSERT_EQ(train.size(), 60000);
  std::vector<int64_t> counts(10, 0);
  for (int64_t t : train.targets()) ++counts[static_cast<size_t>(t)];
  EXPECT_EQ(counts, std::vector<int64_t>(10, 6000));
  EXPECT_EQ(std::vector<int64_t>(train.targets().begin(), train.targets().begin() + 10),
            (std::vector<int64_t>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5}));
  // Values read once with Python's gzip module from the same files.
  EXPECT_EQ(pixel_sum(train, 0), 76247);
  EXPECT_EQ(pixel(train, 0, 14, 14), 217);
  EXPECT_EQ(pixel_sum(train, 1), 84598);
  EXPECT_EQ(pixel(train, 1, 10, 5), 223);
  EXPECT_EQ(pixel_sum(train, 59999), 16684);
  EXPECT_EQ(train.get(59999).target, 5);
}

TEST(FashionMnist, DebianPackageTestSplit) {
  if (!fashion_mnist_installed()) GTEST_SKIP() << "apt-get install dataset-fashion-mnist";
  FashionMnist test(Split::kTest);
  ASSERT_EQ(test.size(), 10000);
  std::vector<int64_t> counts(10, 0);
  for (int64_t t : test.targets()) ++counts[static_cast<size_t>(t)];
  EXPECT_EQ(counts, std::vector<int64_t>(10, 1000));
  EXPECT_EQ(pixel_sum(test, 0), 33456);
  EXPECT_EQ(pixel(test, 0, 14, 14), 110);
  EXPECT_EQ(pixel(test, 1, 10, 5), 255);
  EXPECT_EQ(pixel_sum(test, 9999), 24390);
  EXPECT_EQ(pixel(test, 9999, 10, 5), 5);
}

}  // namespace
}  // namespace ember::data
