// The hostile-disk corpus of issue 26: every kind of bad file found there is generated here
// (no checked-in blobs) and must give its exact outcome, an ember::Error naming the file and
// the reason, or the documented acceptance. Nothing may hang: special files are bounded by
// a watchdog that unblocks them.
#include <ember/data/dataloader.h>
#include <ember/data/datasets.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <string>

#include "data_files.h"
#include "test_util.h"

namespace ember::data {
namespace {

using testing::Bytes;
using testing::TempDir;

Bytes rgb(int w, int h, int seed = 0) {
  Bytes hwc;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) hwc.push_back(testing::test_pixel(seed, c, y, x));
  return hwc;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("NOT AN ember::Error: ") + e.what();
  }
  return "NO ERROR";
}

// Runs `f` (which opens `fifo`) with a 10 s bound: a reader stuck in open() is released by
// opening the FIFO's other end, and the test fails instead of hanging.
std::string bounded_error(const std::string& fifo, const std::function<void()>& f) {
  auto result = std::async(std::launch::async, [&] { return error_of(f); });
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "reading '" << fifo << "' blocked for 10 s";
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  }
  return result.get();
}

#define EXPECT_HAS(message, fragment) \
  EXPECT_NE((message).find(fragment), std::string::npos) << "message was: " << (message)

// --- image formats ember does not read, under an image's name -------------------------------

TEST(Corpus, OtherFormatsUnderImageNamesAreRefusedByName) {
  TempDir dir;
  // A 16-bit binary PGM (P5, maxval 65535), 64x64.
  std::string pgm_text = "P5\n64 64\n65535\n";
  Bytes pgm(pgm_text.begin(), pgm_text.end());
  pgm.resize(pgm.size() + 64 * 64 * 2, 0xab);
  // A truncated uncompressed true-colour TGA (type 2), 16x16 claimed, 10 pixels given.
  Bytes tga = {0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 16, 0, 24, 0};
  tga.resize(tga.size() + 30, 0x40);
  // A truncated run-length Radiance HDR.
  std::string hdr_text = "#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n-Y 512 +X 512\n";
  Bytes hdr(hdr_text.begin(), hdr_text.end());
  hdr.insert(hdr.end(), {2, 2, 2, 0, 0x80, 0x10});
  std::string gif_text = "GIF89a";
  Bytes gif(gif_text.begin(), gif_text.end());
  gif.resize(40, 0);
  std::string psd_text = "8BPS";
  Bytes psd(psd_text.begin(), psd_text.end());
  psd.resize(40, 0);
  const struct {
    const char* file;
    Bytes bytes;
    const char* format;
  } cases[] = {{"cat/a.png", pgm, "a PGM"},
               {"cat/b.png", tga, "a TGA"},
               {"cat/c.png", hdr, "a Radiance HDR"},
               {"cat/d.jpg", gif, "a GIF"},
               {"cat/e.bmp", psd, "a PSD"}};
  for (const auto& c : cases) dir.write(c.file, c.bytes);
  ImageFolder folder(dir.path());
  ASSERT_EQ(folder.size(), 5);
  for (int64_t i = 0; i < folder.size(); ++i) {
    const std::string path = dir.path() + "/" + cases[i].file;
    EXPECT_EQ(folder.describe(i), path);
    EXPECT_EMBER_ERROR(folder.get(i), "'" + path + "' is " + cases[i].format +
                                          " file; ember reads PNG, JPEG and BMP");
  }
  EXPECT_EMBER_ERROR(decode_image(dir.write("x.png", {'h', 'e', 'l', 'l', 'o'})),
                     "is not a PNG, JPEG or BMP file (it starts with bytes 68 65 6c 6c 6f)");
  EXPECT_EMBER_ERROR(decode_image(dir.write("empty.png", {})), "empty.png' is empty (0 bytes)");
}

// --- special files ---------------------------------------------------------------------------

TEST(Corpus, FifosAndDevicesAreRefusedWithoutBlocking) {
  TempDir dir;
  const std::string fifo = dir.path() + "/train-images-idx3-ubyte";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  dir.write("train-labels-idx1-ubyte", testing::idx({1}, {3}));
  EXPECT_HAS(bounded_error(fifo, [&] { Mnist(dir.path(), Split::kTrain); }),
             "'" + fifo + "' is a FIFO (named pipe), not a regular file");

  const std::string cifar = dir.path() + "/cifar-10-batches-bin/test_batch.bin";
  std::filesystem::create_directories(dir.path() + "/cifar-10-batches-bin");
  ASSERT_EQ(::mkfifo(cifar.c_str(), 0600), 0);
  EXPECT_HAS(bounded_error(cifar, [&] { Cifar10(dir.path(), Split::kTest); }),
             "'" + cifar + "' is a FIFO (named pipe)");

  const std::string image = dir.path() + "/images/cat/a.png";
  std::filesystem::create_directories(dir.path() + "/images/cat");
  ASSERT_EQ(::mkfifo(image.c_str(), 0600), 0);
  std::filesystem::create_symlink("/dev/zero", dir.path() + "/images/cat/b.png");
  ImageFolder folder(dir.path() + "/images");
  ASSERT_EQ(folder.size(), 2);
  EXPECT_HAS(bounded_error(image, [&] { folder.get(0); }), "'" + image + "' is a FIFO");
  EXPECT_EMBER_ERROR(folder.get(1), "cat/b.png' is a character device, not a regular file");
  EXPECT_EMBER_ERROR(decode_image(dir.path()), "' is a directory, not a regular file");

  // A symlink to /dev/zero where an idx file is expected.
  TempDir zero;
  std::filesystem::create_symlink("/dev/zero", zero.path() + "/t10k-images-idx3-ubyte");
  zero.write("t10k-labels-idx1-ubyte", testing::idx({1}, {3}));
  EXPECT_EMBER_ERROR(Mnist(zero.path(), Split::kTest),
                     "t10k-images-idx3-ubyte' is a character device, not a regular file");
}

// --- decompression bombs and files larger than their dataset -----------------------------------

// Packs bits LSB-first, as deflate does; Huffman codes go in MSB-first.
struct BitWriter {
  Bytes out;
  uint32_t acc = 0;
  int n = 0;
  void bits(uint32_t value, int count) {
    for (int i = 0; i < count; ++i) {
      acc |= ((value >> i) & 1u) << n;
      if (++n == 8) {
        out.push_back(static_cast<uint8_t>(acc));
        acc = 0;
        n = 0;
      }
    }
  }
  void code(uint32_t code, int count) {
    for (int i = count - 1; i >= 0; --i) bits((code >> i) & 1u, 1);
  }
  void literal(uint8_t v) {  // fixed Huffman literal/length codes 0-255
    if (v < 144) {
      code(0x30 + v, 8);
    } else {
      code(0x190 + (v - 144), 9);
    }
  }
  Bytes finish() {
    if (n > 0) out.push_back(static_cast<uint8_t>(acc));
    return out;
  }
};

// A gzip member whose fixed-Huffman deflate stream gives `prefix` and then `zeros` zero bytes
// (in matches of 258, ~13 bits each). Its CRC is left 0: readers must stop before it.
Bytes gzip_bomb(const Bytes& prefix, uint64_t zeros) {
  BitWriter w;
  w.out = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff};
  w.bits(1, 1);  // BFINAL
  w.bits(1, 2);  // fixed Huffman
  for (uint8_t v : prefix) w.literal(v);
  w.literal(0);
  for (uint64_t done = 1; done + 258 <= zeros; done += 258) {
    w.code(0xc5, 8);  // length 258 (code 285)
    w.code(0, 5);     // distance 1
  }
  w.code(0, 7);  // end of block
  Bytes out = w.finish();
  testing::put_le32(out, 0);
  testing::put_le32(out, static_cast<uint32_t>(prefix.size() + zeros));
  return out;
}

TEST(Corpus, GzipBombsStopAtTheSizeTheHeaderImplies) {
  TempDir dir;
  // 1.5 GiB of zeros after a header claiming one 28x28 image.
  const Bytes header = testing::idx({1, 28, 28}, {});
  const std::string bomb = dir.write("train-images-idx3-ubyte.gz", gzip_bomb(header, 3ull << 29));
  dir.write("train-labels-idx1-ubyte", testing::idx({1}, {3}));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EMBER_ERROR(Mnist(dir.path(), Split::kTrain),
                     "'" + bomb +
                         "' inflates to more than the 800 bytes its dims [1, 28, 28] "
                         "imply: the file has trailing data");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  // A header claiming more than its compressed size can inflate to.
  const std::string liar =
      dir.write("liar.gz", gzip_bomb(testing::idx({3'000'000, 28, 28}, {}), 1 << 20));
  EXPECT_EMBER_ERROR(read_idx(liar), "'" + liar +
                                         "' has dims [3000000, 28, 28] (2,352,000,000 "
                                         "bytes), but its ");
  EXPECT_EMBER_ERROR(read_idx(liar), "(deflate expands at most 1032-fold): the header is corrupt");
}

TEST(Corpus, SparseCifarFileIsRefusedBeforeReading) {
  TempDir dir;
  const std::string path = dir.path() + "/cifar-10-batches-bin/test_batch.bin";
  dir.write("cifar-10-batches-bin/test_batch.bin", {});
  ASSERT_EQ(::truncate(path.c_str(), 3073ll * 900'000), 0);  // 2.8 GB, no blocks on disk
  EXPECT_EMBER_ERROR(Cifar10(dir.path(), Split::kTest),
                     "'" + path +
                         "' has 2,765,700,000 bytes, more than the 30,730,000 of the "
                         "10,000 records this file holds in the dataset");
  ASSERT_EQ(::truncate(path.c_str(), 2'500'000'000ll), 0);
  EXPECT_EMBER_ERROR(Cifar10(dir.path(), Split::kTest),
                     "has 2,500,000,000 bytes, not a whole number of 3073-byte records");
}

// --- oversized, truncated and corrupt images ---------------------------------------------------

TEST(Corpus, HugeImageClaimsAreRefusedNamingTheFile) {
  TempDir dir;
  Bytes png = testing::png(2, 2, 3, rgb(2, 2));
  png[16] = png[20] = 0;
  png[17] = png[21] = 0;
  png[18] = png[22] = 0x40;  // 16384 x 16384
  png[19] = png[23] = 0;
  testing::fix_png_crc(png, 12);
  const std::string path = dir.write("big/a.png", png);
  dir.write("big/b.png", testing::png(2, 2, 3, rgb(2, 2)));
  auto folder = std::make_shared<ImageFolder>(dir.path());
  DataLoader loader(folder, {.batch_size = 2});
  EXPECT_EMBER_ERROR(loader.begin(), "'" + path +
                                         "' claims 16384x16384 pixels (268,435,456), "
                                         "more than max_pixels (89,478,485)");
  // max_pixels is the user's to raise or lower.
  EXPECT_EMBER_ERROR(decode_image(dir.path() + "/big/b.png", 3, 3), "more than max_pixels (3)");
  ImageFolderOptions small;
  small.max_pixels = 3;
  EXPECT_EMBER_ERROR(ImageFolder(dir.path(), small).get(1), "claims 2x2 pixels (4)");
  Bytes bmp = testing::bmp(2, 2, rgb(2, 2));
  bmp[18] = bmp[22] = 0;
  bmp[19] = bmp[23] = 0x40;  // 16384 x 16384
  EXPECT_EMBER_ERROR(decode_image(dir.write("big.bmp", bmp)), "claims 16384x16384 pixels");
  // Within max_pixels but more than a file this small can hold: refused before its buffer.
  Bytes small_png = testing::png(2, 2, 3, rgb(2, 2));
  small_png[18] = small_png[22] = 0x20;  // 8194 x 8194 (67,141,636 pixels)
  testing::fix_png_crc(small_png, 12);
  EXPECT_EMBER_ERROR(decode_image(dir.write("claims.png", small_png)),
                     "claims 8194x8194 pixels, more than a PNG file of");
}

// Every proper prefix of a valid file is an error that names the file and says "truncated".
void expect_every_cut_truncated(const TempDir& dir, const std::string& name, const Bytes& valid,
                                size_t from, size_t until, size_t step = 1) {
  for (size_t n = from; n < until; n += n + 8 >= until ? 1 : step) {
    const std::string path = dir.write(name, Bytes(valid.begin(), valid.begin() + n));
    const std::string message = error_of([&] { decode_image(path); });
    EXPECT_HAS(message, "'" + path + "' is truncated") << " (cut at " << n << ")";
  }
}

TEST(Corpus, EveryTruncatedImageIsAnErrorSayingSo) {
  TempDir dir;
  const Bytes png = testing::png(6, 5, 3, rgb(6, 5)), jpeg = testing::jpeg_8x8();
  const Bytes bmp = testing::bmp(6, 5, rgb(6, 5));
  expect_every_cut_truncated(dir, "a.png", png, 1, png.size());
  expect_every_cut_truncated(dir, "a.jpg", jpeg, 3, jpeg.size(), 5);  // (and its last 8)
  // Documented acceptance: a BMP may lack its last row's padding (2 bytes here), which some
  // writers leave out.
  expect_every_cut_truncated(dir, "a.bmp", bmp, 2, bmp.size() - 2);
  EXPECT_EQ(
      decode_image(dir.write("pad.bmp", Bytes(bmp.begin(), bmp.end() - 2))).to_vector<uint8_t>(),
      rgb(6, 5));
  // The BMP message says how far the file is from what its header promises.
  EXPECT_EMBER_ERROR(decode_image(dir.write("cut.bmp", Bytes(bmp.begin(), bmp.end() - 30))),
                     "cut.bmp' is truncated at byte 124 of 152: its header promises 6x5 pixels "
                     "of 24 bits from byte 54");
  EXPECT_EMBER_ERROR(decode_image(dir.write("cut.png", Bytes(png.begin(), png.end() - 12))),
                     "cut.png' is truncated: its PNG data ends at byte " +
                         std::to_string(png.size() - 12) +
                         " (the end of the file) before its IEND chunk");
}

TEST(Corpus, BadHeaderFieldsGiveTheRealReason) {
  TempDir dir;
  Bytes png = testing::png(2, 2, 3, rgb(2, 2));
  Bytes zero_width = png;
  zero_width[19] = 0;
  testing::fix_png_crc(zero_width, 12);
  EXPECT_EMBER_ERROR(decode_image(dir.write("w.png", zero_width)),
                     "w.png' is a corrupt PNG file (libpng: Invalid IHDR data: Image width is zero "
                     "in IHDR, at byte 33 of 82)");
  Bytes depth = png;
  depth[24] = 3;
  testing::fix_png_crc(depth, 12);
  EXPECT_EMBER_ERROR(decode_image(dir.write("d.png", depth)),
                     "Invalid color type/bit depth combination in IHDR");
  Bytes flipped = png;
  flipped[25] ^= 0x01;  // interlace method 0 -> 1, under the IHDR's CRC
  EXPECT_EMBER_ERROR(decode_image(dir.write("f.png", flipped)),
                     "f.png' is a corrupt PNG file (libpng: IHDR: CRC error");
  // A flipped pixel byte inside IDAT, with the chunk's CRC recomputed: zlib's Adler-32
  // still catches it.
  flipped = png;
  flipped[flipped.size() - 30] ^= 0x10;
  testing::fix_png_crc(flipped, 8 + 25 + 4);
  EXPECT_EMBER_ERROR(decode_image(dir.write("a.png", flipped)),
                     "a.png' is a corrupt PNG file (libpng: IDAT: incorrect data check");

  const Bytes bmp = testing::bmp(2, 2, rgb(2, 2));
  Bytes bits16 = bmp;
  bits16[28] = 16;
  EXPECT_EMBER_ERROR(decode_image(dir.write("b.bmp", bits16)),
                     "b.bmp' is a BMP file ember cannot read: 16-bit pixels are not supported");
  Bytes rle = bmp;
  rle[30] = 1;
  EXPECT_EMBER_ERROR(decode_image(dir.write("r.bmp", rle)), "RLE8 compression (1)");
  Bytes zero_bmp = bmp;
  zero_bmp[18] = 0;
  EXPECT_EMBER_ERROR(decode_image(dir.write("z.bmp", zero_bmp)),
                     "z.bmp' is a BMP file with zero width (0x2)");
}

// JPEG segments of type `marker` removed.
Bytes without_segments(const Bytes& jpeg, uint8_t marker) {
  Bytes out(jpeg.begin(), jpeg.begin() + 2);
  size_t i = 2;
  while (i + 4 <= jpeg.size() && jpeg[i] == 0xff && jpeg[i + 1] != 0xda) {
    const size_t length = (size_t{jpeg[i + 2]} << 8) | jpeg[i + 3];
    if (jpeg[i + 1] != marker)
      out.insert(out.end(), jpeg.begin() + i, jpeg.begin() + i + 2 + length);
    i += 2 + length;
  }
  out.insert(out.end(), jpeg.begin() + i, jpeg.end());
  return out;
}

TEST(Corpus, JpegTables) {
  TempDir dir;
  const Bytes jpeg = testing::jpeg_8x8();
  // Without its quantisation tables a JPEG cannot be decoded.
  EXPECT_EMBER_ERROR(decode_image(dir.write("q.jpg", without_segments(jpeg, 0xdb))),
                     "q.jpg' is a corrupt JPEG file (libjpeg: Quantization table 0x00 was not "
                     "defined)");
  // Documented acceptance: without Huffman tables libjpeg uses the standard ones (the
  // Motion-JPEG convention). This file was written with them, so it decodes identically.
  const Tensor with = decode_image(dir.write("h0.jpg", jpeg));
  const Tensor without = decode_image(dir.write("h1.jpg", without_segments(jpeg, 0xc4)));
  EXPECT_EQ(with.to_vector<uint8_t>(), without.to_vector<uint8_t>());
  // The precision field says 12 bits: refused by libjpeg's 8-bit build.
  Bytes precision = jpeg;
  for (size_t i = 0; i + 4 < precision.size(); ++i) {
    if (precision[i] == 0xff && precision[i + 1] == 0xc0) {
      precision[i + 4] = 12;
      break;
    }
  }
  EXPECT_EMBER_ERROR(decode_image(dir.write("p.jpg", precision)),
                     "p.jpg' is a corrupt JPEG file (libjpeg: Unsupported JPEG data precision 12)");
}

// --- valid files: accepted, and identical through get() and the DataLoader ----------------------

TEST(Corpus, TopDownBmpSixteenBitPngAndGreyConversion) {
  TempDir dir;
  const Bytes hwc = rgb(5, 3);
  EXPECT_EQ(decode_image(dir.write("td.bmp", testing::bmp(5, 3, hwc, true))).to_vector<uint8_t>(),
            hwc);
  EXPECT_EQ(decode_image(dir.write("bu.bmp", testing::bmp(5, 3, hwc))).to_vector<uint8_t>(), hwc);
  // 16-bit grey: the high byte of each sample.
  const Bytes grey16 = {0x12, 0x34, 0xff, 0x01, 0x00, 0xff, 0x80, 0x00};
  EXPECT_EQ(
      decode_image(dir.write("g16.png", testing::png(2, 2, 1, grey16, 16)), 1).to_vector<uint8_t>(),
      (Bytes{0x12, 0xff, 0x00, 0x80}));
  // RGB to grey as PIL's convert("L"): (19595 R + 38470 G + 7471 B + 2^15) >> 16.
  const Bytes pixel = {200, 30, 90};
  EXPECT_EQ(decode_image(dir.write("c.png", testing::png(1, 1, 3, pixel)), 1).to_vector<uint8_t>(),
            (Bytes{(200 * 19595 + 30 * 38470 + 90 * 7471 + 32768) >> 16}));
  // Grey+alpha to RGBA keeps alpha; RGB to RGBA adds 255.
  EXPECT_EQ(
      decode_image(dir.write("ga.png", testing::png(1, 1, 2, {7, 9})), 4).to_vector<uint8_t>(),
      (Bytes{7, 7, 7, 9}));
  EXPECT_EQ(decode_image(dir.path() + "/c.png", 4).to_vector<uint8_t>(), (Bytes{200, 30, 90, 255}));
}

TEST(Corpus, BytesAfterTheImagesEndAreIgnored) {
  TempDir dir;
  const Bytes hwc = rgb(6, 5), tail = {1, 2, 3, 4, 5, 6, 7};
  for (Bytes file : {testing::png(6, 5, 3, hwc), testing::bmp(6, 5, hwc)}) {
    file.insert(file.end(), tail.begin(), tail.end());
    EXPECT_EQ(decode_image(dir.write("tail", file)).to_vector<uint8_t>(), hwc);
  }
  Bytes jpeg = testing::jpeg_8x8();
  const Tensor clean = decode_image(dir.write("a.jpg", jpeg));
  jpeg.insert(jpeg.end(), tail.begin(), tail.end());
  EXPECT_EQ(decode_image(dir.write("b.jpg", jpeg)).to_vector<uint8_t>(),
            clean.to_vector<uint8_t>());
  // Mid-image truncation says how far decoding got.
  const Bytes png = testing::png(6, 5, 3, hwc);
  EXPECT_EMBER_ERROR(decode_image(dir.write("mid.png", Bytes(png.begin(), png.begin() + 90))),
                     "mid.png' is truncated: its PNG data ends at byte 90 (the end of the file) "
                     "before the image was complete (0 of 5 rows decoded)");
}

TEST(Corpus, GetAndDataLoaderAgreeAndCollateNamesTheFiles) {
  TempDir dir;
  dir.write("a/1.png", testing::png(4, 4, 3, rgb(4, 4, 1)));
  dir.write("a/2.bmp", testing::bmp(4, 4, rgb(4, 4, 2), true));
  dir.write("b/3.jpg", testing::jpeg_8x8());
  dir.write("b/4.png", testing::png(4, 4, 1, Bytes(16, 77)));
  ImageFolderOptions options;
  options.channels = 1;
  auto folder = std::make_shared<ImageFolder>(dir.path(), options);
  DataLoader loader(folder, {.batch_size = 1, .num_workers = 2});
  int64_t i = 0;
  for (const Batch& batch : loader) {
    EXPECT_EQ(batch.data.select(0, 0).to_vector<uint8_t>(),
              folder->get(i).data.to_vector<uint8_t>())
        << folder->describe(i);
    ++i;
  }
  EXPECT_EQ(i, 4);
  DataLoader pairs(folder, {.batch_size = 2});
  EXPECT_EMBER_ERROR(for (const Batch& b
                          : pairs)(void) b,
                     "sample 3 (batch 1 of epoch 0) failed: collate: its data (index "
                     "3, '" +
                         dir.path() +
                         "/b/4.png') is u8 [4, 4, 1] but the "
                         "batch's first sample (index 2, '" +
                         dir.path() + "/b/3.jpg') is u8 [8, 8, 1]");
}

TEST(Corpus, SkipBadFilesNamesAndCountsThem) {
  TempDir dir;
  dir.write("a/good.png", testing::png(2, 2, 3, rgb(2, 2)));
  const Bytes png = testing::png(2, 2, 3, rgb(2, 2));
  const std::string cut = dir.write("a/cut.png", Bytes(png.begin(), png.end() - 20));
  const std::string gif = dir.write("b/pic.gif.png", {'G', 'I', 'F', '8', '9', 'a', 0, 0});
  dir.write("b/good.bmp", testing::bmp(2, 2, rgb(2, 2)));
  EXPECT_EQ(ImageFolder(dir.path()).size(), 4);  // failing is the default: get() says why
  ImageFolderOptions skip;
  skip.skip_bad_files = true;
  ImageFolder folder(dir.path(), skip);
  ASSERT_EQ(folder.size(), 2);
  EXPECT_EQ(folder.samples()[0].first, dir.path() + "/a/good.png");
  EXPECT_EQ(folder.samples()[1].second, 1);
  ASSERT_EQ(folder.bad_files().size(), 2u);
  EXPECT_EQ(folder.bad_files()[0].path, cut);
  EXPECT_HAS(folder.bad_files()[0].reason, "is truncated");
  EXPECT_EQ(folder.bad_files()[1].path, gif);
  EXPECT_HAS(folder.bad_files()[1].reason, "is a GIF file");
}

// --- idx dims ------------------------------------------------------------------------------------

TEST(Corpus, MnistChecksTheDimsItPromises) {
  TempDir dir;
  const auto write = [&](const Bytes& images, const Bytes& labels) {
    dir.write("train-images-idx3-ubyte", images);
    dir.write("train-labels-idx1-ubyte", labels);
  };
  write(testing::idx({1, 14, 56}, Bytes(784, 1)), testing::idx({1}, {2}));
  EXPECT_EMBER_ERROR(Mnist(dir.path(), Split::kTrain),
                     "train-images-idx3-ubyte' holds 14x56 images (dims [1, 14, 56]), but "
                     "MNIST-format images are 28x28");
  write(testing::idx({5, 0, 0}, {}), testing::idx({5}, {1, 2, 3, 4, 5}));
  EXPECT_EMBER_ERROR(Mnist(dir.path(), Split::kTrain), "holds 0x0 images");
  write(testing::idx({0, 28, 28}, {}), testing::idx({0}, {}));
  EXPECT_EMBER_ERROR(Mnist(dir.path(), Split::kTrain),
                     "train-images-idx3-ubyte' holds no images (dims [0, 28, 28]): the dataset "
                     "is empty");
  // The magic number as read: 16 dims is 0x00000810.
  write(testing::idx(std::vector<uint32_t>(16, 1), {7}), testing::idx({1}, {2}));
  EXPECT_EMBER_ERROR(Mnist(dir.path(), Split::kTrain),
                     "has 16 dims (magic number 0x00000810), but an images file has 3 "
                     "(0x00000803)");
  write(testing::idx({1, 28, 28}, Bytes(784, 1)), {});
  EXPECT_EMBER_ERROR(Mnist(dir.path(), Split::kTrain), "train-labels-idx1-ubyte' is empty");
}

}  // namespace
}  // namespace ember::data
