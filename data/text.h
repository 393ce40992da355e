// Text datasets for language models (minGPT's CharDataset and a byte-level twin): one long
// token sequence read from text files, cut into overlapping windows.
//
// Example i is the window of block_size + 1 tokens starting at token i: its data is
// x = tokens[i : i + block_size] and its target_tensor y = tokens[i + 1 : i + block_size + 1],
// both i64 [block_size], so a DataLoader batch holds x and y as i64 [B, block_size]. There
// are num_tokens - block_size windows (as minGPT's len(data) - block_size).
//
// Characters are Unicode code points: a CharDataset decodes its files as UTF-8 (strictly:
// overlong forms, surrogates, values past U+10FFFF and cut-off sequences are errors naming the
// file and the byte offset; there is no byte fallback, read such files with ByteDataset), and
// its vocabulary is the sorted distinct code points of the corpus. A ByteDataset takes the
// bytes as they are, vocabulary 0..255.
//
//   data::CharDataset text(data::fortune_files(), 128);
//   text.vocabulary().save(dir + "/vocab.txt");           // beside the snapshots
//   auto vocab = data::TextVocabulary::load(dir + "/vocab.txt");
//   std::string s = vocab.decode(vocab.encode("hello"));  // "hello"
//
// Files are untrusted: only regular files are read (FIFOs, devices and directories are refused
// without blocking), the corpus is bounded by TextDatasetOptions::max_bytes before anything is
// read, and every refusal is an ember::Error naming the file and the reason.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dataset.h"

namespace ember::data {

// The ids of a text model's tokens: code points (kChar) or bytes (kByte).
class TextVocabulary {
 public:
  enum class Kind { kChar, kByte };

  // Every byte: id b is byte b.
  static TextVocabulary bytes();
  // The sorted distinct code points of `utf8` (ember::Error on invalid UTF-8).
  static TextVocabulary chars_of(std::string_view utf8);
  // These code points (each a Unicode scalar value, strictly increasing, at least one):
  // id k is code_points[k].
  explicit TextVocabulary(std::vector<char32_t> code_points);

  Kind kind() const { return kind_; }
  int64_t size() const;
  // The code points in id order (empty for bytes).
  const std::vector<char32_t>& code_points() const { return code_points_; }

  // Token ids of `text`: one per code point (kChar; ember::Error naming the position on
  // invalid UTF-8 or a character not in the vocabulary) or per byte (kByte).
  std::vector<int64_t> encode(std::string_view text) const;
  // The text of `ids` (ember::Error on an id outside [0, size())). Byte vocabularies return
  // the bytes as they are, which need not be valid UTF-8.
  std::string decode(const std::vector<int64_t>& ids) const;
  // The same for an integer tensor of any shape (its elements in order), e.g. a sample [T].
  std::string decode(const Tensor& ids) const;

  // Writes the vocabulary to `path` (via a temporary file and a rename): a header line
  // "ember-vocab 1 char N" or "ember-vocab 1 byte 256", then, for kChar, the N characters
  // in id order as UTF-8. load() reads it back, refusing anything else by name.
  void save(const std::string& path) const;
  static TextVocabulary load(const std::string& path);

  bool operator==(const TextVocabulary& other) const = default;

 private:
  TextVocabulary() = default;
  Kind kind_ = Kind::kByte;
  std::vector<char32_t> code_points_;  // sorted; empty for kByte
};

// The largest corpus a text dataset reads by default (all its files together): it is held
// in memory, one byte or four per token.
constexpr uint64_t kDefaultMaxTextBytes = uint64_t{1} << 30;

struct TextDatasetOptions {
  uint64_t max_bytes = kDefaultMaxTextBytes;  // files larger in all are refused before reading
  // kChar: encode with this vocabulary (a snapshot's, or the training set's for a validation
  // file) instead of the corpus's own; a character outside it is an error naming the file.
  std::optional<TextVocabulary> vocabulary = std::nullopt;
};

// The files' contents, concatenated in order, as windows of block_size + 1 tokens.
class TextDataset : public Dataset {
 public:
  int64_t size() const override { return num_tokens() - block_size_; }
  // x and y of window `index` (see the top of this file).
  Example get(int64_t index) const override;
  // The file window `index` starts in and the token's offset in it.
  std::string describe(int64_t index) const override;

  int64_t block_size() const { return block_size_; }
  int64_t num_tokens() const { return tokens_.numel(); }
  const TextVocabulary& vocabulary() const { return vocabulary_; }
  int64_t vocab_size() const { return vocabulary_.size(); }
  // Every token id of the corpus, [num_tokens()]: u8 when the vocabulary has at most 256
  // entries, i32 otherwise.
  const Tensor& tokens() const { return tokens_; }
  const std::vector<std::string>& files() const { return files_; }

 protected:
  TextDataset(const char* name, std::vector<std::string> files, int64_t block_size,
              TextVocabulary::Kind kind, TextDatasetOptions options);

 private:
  const char* name_;
  std::vector<std::string> files_;
  std::vector<int64_t> file_starts_;  // the token index each file starts at
  int64_t block_size_;
  TextVocabulary vocabulary_;
  Tensor tokens_;
};

// Characters (code points of UTF-8 text) as tokens, minGPT's CharDataset.
class CharDataset : public TextDataset {
 public:
  CharDataset(const std::string& path, int64_t block_size, TextDatasetOptions options = {});
  CharDataset(std::vector<std::string> paths, int64_t block_size, TextDatasetOptions options = {});
};

// Bytes as tokens (vocabulary 256): any file, in any encoding.
class ByteDataset : public TextDataset {
 public:
  ByteDataset(const std::string& path, int64_t block_size, TextDatasetOptions options = {});
  ByteDataset(std::vector<std::string> paths, int64_t block_size, TextDatasetOptions options = {});
};

// Where Debian's fortunes package (apt-get install fortunes) puts its text.
constexpr const char* kFortunesRoot = "/usr/share/games/fortunes";

// The fortune text files in `root`, sorted by name: the regular files there, without the
// strfile indexes (*.dat) and the *.u8 links, and without subfolders (Debian's off/). Together
// they are ember's default text corpus (about 2.5 MB of UTF-8). ember::Error when the folder
// is missing (saying which package installs it) or holds no text file.
std::vector<std::string> fortune_files(const std::string& root = kFortunesRoot);

}  // namespace ember::data
