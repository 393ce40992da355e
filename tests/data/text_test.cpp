// Text datasets (CharDataset, ByteDataset), their vocabulary, the fortunes corpus and the
// random-window sampler: windows, UTF-8, encode/decode round trips, refused files by name,
// and a batch order that depends on the seed and epoch, never on the worker count.
#include <ember/data/dataloader.h>
#include <ember/data/text.h>

#include <sys/stat.h>

#include <filesystem>
#include <set>
#include <string>

#include "data_files.h"
#include "test_util.h"

namespace ember::data {
namespace {

using testing::Bytes;
using testing::TempDir;

Bytes bytes_of(const std::string& s) { return Bytes(s.begin(), s.end()); }

std::string text_of(const Tensor& ids, const TextVocabulary& vocab) { return vocab.decode(ids); }

TEST(CharDataset, WindowsAreXAndYShiftedByOne) {
  TempDir dir;
  const std::string text = "hello world\n";
  CharDataset ds(dir.write("a.txt", bytes_of(text)), 4);
  // Sorted distinct characters: '\n' ' ' d e h l o r w.
  EXPECT_EQ(ds.vocab_size(), 9);
  EXPECT_EQ(ds.vocabulary().code_points(),
            (std::vector<char32_t>{'\n', ' ', 'd', 'e', 'h', 'l', 'o', 'r', 'w'}));
  EXPECT_EQ(ds.num_tokens(), 12);
  EXPECT_EQ(ds.size(), 12 - 4);
  EXPECT_EQ(ds.block_size(), 4);
  EXPECT_EQ(ds.tokens().dtype(), kU8);
  EXPECT_EQ(ds.vocabulary().decode(ds.tokens()), text);
  for (int64_t i = 0; i < ds.size(); ++i) {
    const Example e = ds.get(i);
    ASSERT_EQ(e.data.dtype(), kI64);
    ASSERT_EQ(e.target_tensor.dtype(), kI64);
    ASSERT_EQ(e.data.sizes(), (Shape{4}));
    ASSERT_EQ(e.target_tensor.sizes(), (Shape{4}));
    EXPECT_EQ(text_of(e.data, ds.vocabulary()), text.substr(static_cast<size_t>(i), 4));
    EXPECT_EQ(text_of(e.target_tensor, ds.vocabulary()),
              text.substr(static_cast<size_t>(i) + 1, 4));
  }
  EXPECT_EQ(ds.get(0).data.to_vector<int64_t>(), (std::vector<int64_t>{4, 3, 5, 5}));  // "hell"
  EXPECT_EMBER_ERROR(ds.get(8), "CharDataset: index 8 is out of range for 8 examples");
  EXPECT_EQ(ds.describe(3), "'" + dir.path() + "/a.txt' from token 3");
}

TEST(CharDataset, CharactersAreCodePointsAndRoundTrip) {
  TempDir dir;
  const std::string text = "naïve café, 日本語 🙂 and ü\n";
  CharDataset ds(dir.write("u.txt", bytes_of(text)), 3);
  EXPECT_EQ(ds.num_tokens(), 24);  // code points, not bytes
  const TextVocabulary& v = ds.vocabulary();
  EXPECT_EQ(v.kind(), TextVocabulary::Kind::kChar);
  EXPECT_EQ(v.code_points().back(), U'🙂');
  EXPECT_EQ(v.decode(v.encode(text)), text);
  EXPECT_EQ(v.decode(v.encode("café 🙂")), "café 🙂");
  EXPECT_EQ(v.encode("é").size(), 1u);
  EXPECT_EQ(v, TextVocabulary::chars_of(text));
  EXPECT_EMBER_ERROR(v.encode("cafe X"),
                     "TextVocabulary::encode: character U+0058 'X' at byte 5 is not in the "
                     "vocabulary of 17 characters");
  EXPECT_EMBER_ERROR(v.decode(std::vector<int64_t>{0, 17}),
                     "TextVocabulary::decode: id 17 at position 1 is outside [0, 17)");
  EXPECT_EMBER_ERROR(v.decode(zeros({2})), "ids must be an integer tensor, got f32");
}

TEST(CharDataset, LargeVocabulariesKeepI32Tokens) {
  TempDir dir;
  std::string text;
  for (char32_t c = 0x400; c < 0x400 + 300; ++c) {  // 300 Cyrillic and later code points
    text += static_cast<char>(0xC0 | (c >> 6));
    text += static_cast<char>(0x80 | (c & 0x3F));
  }
  CharDataset ds(dir.write("big.txt", bytes_of(text)), 16);
  EXPECT_EQ(ds.vocab_size(), 300);
  EXPECT_EQ(ds.tokens().dtype(), kI32);
  EXPECT_EQ(ds.get(280).target_tensor.to_vector<int64_t>().back(), 296);
  EXPECT_EQ(ds.vocabulary().decode(ds.tokens()), text);
}

TEST(CharDataset, SeveralFilesAreOneCorpus) {
  TempDir dir;
  const std::string a = dir.write("a.txt", bytes_of("abc")), b = dir.write("b.txt", bytes_of("")),
                    c = dir.write("c.txt", bytes_of("défg"));
  CharDataset ds({a, b, c}, 2);
  EXPECT_EQ(ds.num_tokens(), 7);
  EXPECT_EQ(ds.files(), (std::vector<std::string>{a, b, c}));
  EXPECT_EQ(text_of(ds.get(2).data, ds.vocabulary()), "cd");
  EXPECT_EQ(ds.describe(2), "'" + a + "' from token 2");
  EXPECT_EQ(ds.describe(4), "'" + c + "' from token 1");
  EXPECT_EQ(ds.describe(99), "");
}

TEST(ByteDataset, TakesAnyBytes) {
  TempDir dir;
  const Bytes raw = {'a', 0xff, 0x00, 0xc3, 'b', 0x80};  // not UTF-8
  ByteDataset ds(dir.write("bin", raw), 2);
  EXPECT_EQ(ds.vocab_size(), 256);
  EXPECT_EQ(ds.vocabulary(), TextVocabulary::bytes());
  EXPECT_EQ(ds.vocabulary().kind(), TextVocabulary::Kind::kByte);
  EXPECT_TRUE(ds.vocabulary().code_points().empty());
  EXPECT_EQ(ds.size(), 4);
  EXPECT_EQ(ds.tokens().to_vector<int64_t>(), (std::vector<int64_t>{'a', 255, 0, 0xc3, 'b', 0x80}));
  EXPECT_EQ(ds.get(1).data.to_vector<int64_t>(), (std::vector<int64_t>{255, 0}));
  EXPECT_EQ(ds.get(1).target_tensor.to_vector<int64_t>(), (std::vector<int64_t>{0, 0xc3}));
  const std::string s("\xff\x00z\xc3", 4);
  EXPECT_EQ(ds.vocabulary().decode(ds.vocabulary().encode(s)), s);
  EXPECT_EQ(ByteDataset(dir.write("u.txt", bytes_of("héllo")), 3).num_tokens(), 6);  // bytes
}

TEST(TextDataset, BadFilesAreRefusedByName) {
  TempDir dir;
  const std::string missing = dir.path() + "/missing.txt";
  EXPECT_EMBER_ERROR(CharDataset(missing, 4), "CharDataset: cannot open '" + missing + "'");
  EXPECT_EMBER_ERROR(CharDataset(dir.path(), 4),
                     "CharDataset: '" + dir.path() + "' is a directory, not a regular file");
  const std::string fifo = dir.path() + "/fifo.txt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);  // refused by stat before any open: no blocking
  EXPECT_EMBER_ERROR(ByteDataset(fifo, 4), "ByteDataset: '" + fifo + "' is a FIFO (named pipe)");
  const std::string zero = dir.path() + "/zero.txt";
  std::filesystem::create_symlink("/dev/zero", zero);
  EXPECT_EMBER_ERROR(CharDataset(zero, 4), "'" + zero + "' is a character device");

  const std::string short_file = dir.write("short.txt", bytes_of("héllo"));
  EXPECT_EMBER_ERROR(CharDataset(short_file, 5),
                     "CharDataset: '" + short_file +
                         "' has 5 characters, too few for one window of block_size + 1 = 6 "
                         "characters");
  EXPECT_EQ(CharDataset(short_file, 4).size(), 1);
  EXPECT_EMBER_ERROR(ByteDataset(short_file, 6),
                     "' has 6 bytes, too few for one window of "
                     "block_size + 1 = 7 bytes");
  const std::string empty = dir.write("empty.txt", {});
  EXPECT_EMBER_ERROR(CharDataset({empty, short_file}, 9),
                     "'" + empty + "', '" + short_file + "' have 5 characters in all, too few");
  EXPECT_EMBER_ERROR(CharDataset(short_file, 0), "block_size must be >= 1, got 0");
  EXPECT_EMBER_ERROR(CharDataset(std::vector<std::string>{}, 4), "CharDataset: no files given");

  const std::string big = dir.write("big.txt", Bytes(100, 'x'));
  EXPECT_EMBER_ERROR(CharDataset({short_file, big}, 4, {.max_bytes = 64}),
                     "CharDataset: '" + big +
                         "' has 100 bytes, which brings the corpus to 106 "
                         "bytes, more than TextDatasetOptions::max_bytes = 64");
}

TEST(TextDataset, InvalidUtf8IsRefusedWithItsOffset) {
  TempDir dir;
  const struct {
    Bytes bytes;
    const char* where;
  } cases[] = {
      {{'o', 'k', 0x80, 'x'}, "at byte 2 (bytes 80 78)"},             // lone continuation
      {{'a', 0xc0, 0xaf, 'b'}, "at byte 1 (bytes c0 af 62)"},         // overlong '/'
      {{'a', 'b', 0xed, 0xa0, 0x80}, "at byte 2 (bytes ed a0 80)"},   // a surrogate
      {{'a', 'b', 'c', 0xf4, 0x90, 0x80, 0x80}, "at byte 3"},         // past U+10FFFF
      {{'a', 'b', 'c', 'd', 0xe6, 0x97}, "at byte 4 (bytes e6 97)"},  // cut off at the end
      {{'a', 0xff, 'b', 'c'}, "at byte 1 (bytes ff 62 63)"},          // never in UTF-8
  };
  int k = 0;
  for (const auto& c : cases) {
    const std::string path = dir.write(std::to_string(k++) + ".bad.txt", c.bytes);
    EXPECT_EMBER_ERROR(CharDataset(path, 1),
                       "CharDataset: '" + path + "' is not valid UTF-8 " + c.where);
    EXPECT_EQ(ByteDataset(path, 1).num_tokens(), static_cast<int64_t>(c.bytes.size()));
  }
  EXPECT_EMBER_ERROR(TextVocabulary::chars_of("a\xc3"),
                     "TextVocabulary::chars_of: the text is not valid UTF-8 at byte 1 (bytes c3)");
}

TEST(TextDataset, AGivenVocabularyEncodesOtherFiles) {
  TempDir dir;
  CharDataset train(dir.write("train.txt", bytes_of("abcabcabd")), 2);
  const std::string val_path = dir.write("val.txt", bytes_of("dcba"));
  CharDataset val(val_path, 2, {.vocabulary = train.vocabulary()});
  EXPECT_EQ(val.vocabulary(), train.vocabulary());
  EXPECT_EQ(val.tokens().to_vector<int64_t>(), (std::vector<int64_t>{3, 2, 1, 0}));
  const std::string other = dir.write("other.txt", bytes_of("abxd"));
  EXPECT_EMBER_ERROR(CharDataset(other, 2, {.vocabulary = train.vocabulary()}),
                     "CharDataset: '" + other +
                         "' has character U+0078 'x' at byte 2, which is "
                         "not in the given vocabulary of 4 characters");
  EXPECT_EMBER_ERROR(
      CharDataset(val_path, 2, {.vocabulary = TextVocabulary::bytes()}),
      "the vocabulary given is a byte vocabulary; this dataset needs a character one");
}

TEST(TextVocabulary, SavesAndLoads) {
  TempDir dir;
  const TextVocabulary chars = TextVocabulary::chars_of("zébra\n\t 🙂");
  chars.save(dir.path() + "/chars.vocab");
  EXPECT_EQ(TextVocabulary::load(dir.path() + "/chars.vocab"), chars);
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/chars.vocab.tmp"));
  TextVocabulary::bytes().save(dir.path() + "/bytes.vocab");
  EXPECT_EQ(TextVocabulary::load(dir.path() + "/bytes.vocab"), TextVocabulary::bytes());
  EXPECT_NE(TextVocabulary::load(dir.path() + "/bytes.vocab"), chars);
  // The file is readable: its header and its characters in id order.
  std::ifstream in(dir.path() + "/chars.vocab", std::ios::binary);
  const std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "ember-vocab 1 char 9\n\t\n abrzé🙂");
  // Overwriting an existing vocabulary replaces it.
  TextVocabulary::chars_of("xy").save(dir.path() + "/chars.vocab");
  EXPECT_EQ(TextVocabulary::load(dir.path() + "/chars.vocab").size(), 2);
  EXPECT_EMBER_ERROR(
      chars.save(dir.path() + "/no/such/folder/v"),
      "TextVocabulary::save: cannot write '" + dir.path() + "/no/such/folder/v.tmp'");
}

TEST(TextVocabulary, DamagedFilesAreRefusedByName) {
  TempDir dir;
  const struct {
    const char* content;
    const char* message;
  } cases[] = {
      {"hello\n", "is not an ember vocabulary file"},
      {"ember-vocab 1 char 3", "is not an ember vocabulary file"},  // no newline
      {"ember-vocab 1 word 3\nabc", "has header \"ember-vocab 1 word 3\""},
      {"ember-vocab 1 char -3\nabc", "has header \"ember-vocab 1 char -3\""},
      {"ember-vocab 1 char 99999999999999\nabc", "has header"},
      {"ember-vocab 1 char 4\nabc", "holds 3 characters but its header says 4"},
      {"ember-vocab 1 char 3\nacb",
       "is damaged: TextVocabulary: entry 2 (U+0062 'b') does "
       "not follow entry 1 (U+0063 'c')"},
      {"ember-vocab 1 char 3\naab", "is damaged"},
      {"ember-vocab 1 char 2\na\xc3", "is not valid UTF-8 at byte 1"},
      {"ember-vocab 1 byte 256\nx", "has 1 bytes after its \"byte 256\" header"},
  };
  int k = 0;
  for (const auto& c : cases) {
    const std::string path = dir.write(std::to_string(k++) + ".vocab", bytes_of(c.content));
    EXPECT_EMBER_ERROR(TextVocabulary::load(path), "'" + path + "' " + c.message);
  }
  EXPECT_EMBER_ERROR(TextVocabulary::load(dir.path()), "is a directory, not a regular file");
  EXPECT_EMBER_ERROR(TextVocabulary(std::vector<char32_t>{}), "needs at least one character");
  EXPECT_EMBER_ERROR(TextVocabulary(std::vector<char32_t>{'a', 0xD800}),
                     "entry 1 (55296) is not a Unicode scalar value");
}

// --- the fortunes corpus -------------------------------------------------------------------

TEST(FortuneFiles, TakesTheTextFilesOnly) {
  TempDir dir;
  dir.write("zippy", bytes_of("Yow!\n%\n"));
  dir.write("art", bytes_of("Art.\n%\n"));
  dir.write("art.dat", Bytes(24, 0));
  std::filesystem::create_symlink("art", dir.path() + "/art.u8");
  std::filesystem::create_symlink("art", dir.path() + "/alias");
  dir.write("off/rude", bytes_of("..."));
  EXPECT_EQ(fortune_files(dir.path()),
            (std::vector<std::string>{dir.path() + "/art", dir.path() + "/zippy"}));
  TempDir empty;
  empty.write("x.dat", Bytes(24, 0));
  EXPECT_EMBER_ERROR(fortune_files(empty.path()), "holds no fortune files");
  EXPECT_EMBER_ERROR(fortune_files(dir.path() + "/none"),
                     "is not a folder: install Debian's fortunes package");
}

TEST(FortuneFiles, DebianCorpusIsACharDataset) {
  if (!std::filesystem::exists(std::string(kFortunesRoot) + "/fortunes"))
    GTEST_SKIP() << "apt-get install fortunes";
  const std::vector<std::string> files = fortune_files();
  EXPECT_GT(files.size(), 10u);
  CharDataset text(files, 128);
  EXPECT_GT(text.num_tokens(), 1'000'000);
  EXPECT_LE(text.vocab_size(), 256);  // so the tokens are u8
  EXPECT_EQ(text.tokens().dtype(), kU8);
  // The first file, decoded from the tokens, is the file.
  std::ifstream in(files[0], std::ios::binary);
  const std::string first((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<int64_t> ids = text.vocabulary().encode(first);
  EXPECT_EQ(text.vocabulary().decode(text.tokens().narrow(0, 0, static_cast<int64_t>(ids.size()))),
            first);
}

// --- random windows ----------------------------------------------------------------------------

TEST(RandomWindowStarts, AreDistinctSeededAndPrefixesOfLargerDraws) {
  const auto a = random_window_starts(1000, 50, 7, 0);
  EXPECT_EQ(std::set<int64_t>(a.begin(), a.end()).size(), 50u);
  for (int64_t s : a) EXPECT_TRUE(s >= 0 && s < 1000) << s;
  EXPECT_EQ(random_window_starts(1000, 50, 7, 0), a);
  EXPECT_NE(random_window_starts(1000, 50, 7, 1), a);  // another epoch
  EXPECT_NE(random_window_starts(1000, 50, 8, 0), a);  // another seed
  // 50 of 1000 uses the sparse path, 1000 of 1000 the dense one: the same draws.
  const auto all = random_window_starts(1000, 1000, 7, 0);
  EXPECT_EQ(std::vector<int64_t>(all.begin(), all.begin() + 50), a);
  EXPECT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), 1000u);
  EXPECT_TRUE(random_window_starts(5, 0, 1, 0).empty());
  EXPECT_EMBER_ERROR(random_window_starts(5, 6, 1, 0), "cannot draw 6 distinct windows from 5");
}

TEST(RandomWindowSampler, FollowsTheEpoch) {
  RandomWindowSampler sampler(1000, 64, 3);
  EXPECT_EQ(sampler.size(), 64);
  EXPECT_EQ(sampler.num_windows(), 1000);
  EXPECT_EQ(sampler.seed(), 3u);
  EXPECT_EQ(sampler.indices(), random_window_starts(1000, 64, 3, 0));
  sampler.set_epoch(5);
  EXPECT_EQ(sampler.indices(), random_window_starts(1000, 64, 3, 5));
  EXPECT_EMBER_ERROR(RandomWindowSampler(10, 11), "num_samples 11 is outside [0, 10]");
}

// Batches of a CharDataset under a RandomWindowSampler: x and y stacked as i64 [B, T], the
// same for any number of workers.
TEST(RandomWindowSampler, BatchesDoNotDependOnTheWorkerCount) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 400; ++i) text += static_cast<char>('a' + (i * 7) % 26);
  auto ds = std::make_shared<CharDataset>(dir.write("t.txt", bytes_of(text)), 8);
  std::vector<std::vector<Batch>> runs;
  for (int workers : {0, 1, 3}) {
    auto sampler = std::make_shared<RandomWindowSampler>(ds->size(), 40, 11);
    DataLoader loader(ds, {.batch_size = 6, .num_workers = workers, .sampler = sampler});
    std::vector<Batch> batches;
    for (uint64_t epoch = 0; epoch < 2; ++epoch) {
      sampler->set_epoch(epoch);
      for (const Batch& b : loader)
        batches.push_back({b.data.clone(), b.target.clone(), b.indices});
    }
    runs.push_back(std::move(batches));
  }
  ASSERT_EQ(runs[0].size(), 14u);  // 7 batches of up to 6 per epoch
  const Batch& first = runs[0][0];
  EXPECT_EQ(first.data.sizes(), (Shape{6, 8}));
  EXPECT_EQ(first.target.sizes(), (Shape{6, 8}));
  EXPECT_EQ(first.data.dtype(), kI64);
  const auto starts = random_window_starts(ds->size(), 40, 11, 0);
  EXPECT_EQ(first.indices, std::vector<int64_t>(starts.begin(), starts.begin() + 6));
  for (int64_t r = 0; r < 6; ++r) {
    const size_t at = static_cast<size_t>(first.indices[static_cast<size_t>(r)]);
    EXPECT_EQ(ds->vocabulary().decode(first.data.select(0, r)), text.substr(at, 8));
    EXPECT_EQ(ds->vocabulary().decode(first.target.select(0, r)), text.substr(at + 1, 8));
  }
  for (size_t run = 1; run < runs.size(); ++run) {
    ASSERT_EQ(runs[run].size(), runs[0].size());
    for (size_t b = 0; b < runs[0].size(); ++b) {
      EXPECT_EQ(runs[run][b].indices, runs[0][b].indices);
      EXPECT_EQ(runs[run][b].data.to_vector<int64_t>(), runs[0][b].data.to_vector<int64_t>());
      EXPECT_EQ(runs[run][b].target.to_vector<int64_t>(), runs[0][b].target.to_vector<int64_t>());
    }
  }
}

}  // namespace
}  // namespace ember::data
