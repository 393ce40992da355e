#include "text.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <utility>

#include <ember/tensor/error.h>
#include <ember/tensor/ops.h>

#include "detail/io.h"

namespace ember::data {
namespace {

constexpr char32_t kMaxCodePoint = 0x10FFFF;
constexpr const char* kVocabMagic = "ember-vocab 1 ";
// A vocabulary file holds at most every code point, 4 bytes each, and its header.
constexpr uint64_t kMaxVocabBytes = (uint64_t{kMaxCodePoint} + 1) * 4 + 64;

// One UTF-8 sequence at text[pos]: its code point and length, or length 0 when invalid
// (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF, nothing cut off).
struct Decoded {
  char32_t code_point = 0;
  size_t length = 0;
};

Decoded decode_one(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[pos + i]); };
  const uint8_t lead = byte(0);
  if (lead < 0x80) return {lead, 1};
  size_t length = 0;
  char32_t value = 0, min = 0;
  if ((lead & 0xE0) == 0xC0) {
    length = 2, value = lead & 0x1Fu, min = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3, value = lead & 0x0Fu, min = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4, value = lead & 0x07u, min = 0x10000;
  } else {
    return {};
  }
  if (pos + length > text.size()) return {};
  for (size_t i = 1; i < length; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return {};
    value = (value << 6) | (byte(i) & 0x3Fu);
  }
  if (value < min || value > kMaxCodePoint || (value >= 0xD800 && value <= 0xDFFF)) return {};
  return {value, length};
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// "U+00E9 'é'" for messages (the character itself only when printable).
std::string describe_char(char32_t c) {
  char text[16];
  std::snprintf(text, sizeof(text), "U+%04X", static_cast<unsigned>(c));
  std::string out = text;
  if (c >= 0x20 && c != 0x7F && !(c >= 0x80 && c < 0xA0)) {
    out += " '";
    append_utf8(out, c);
    out += "'";
  }
  return out;
}

// The bytes at text[pos] (up to 4) in hex, for an invalid-UTF-8 message.
std::string bytes_at(std::string_view text, size_t pos) {
  std::string out;
  for (size_t i = pos; i < text.size() && i < pos + 4; ++i) {
    char hex[4];
    std::snprintf(hex, sizeof(hex), "%02x", static_cast<uint8_t>(text[i]));
    out += (i == pos ? "" : " ") + std::string(hex);
  }
  return out;
}

// Calls visit(code_point, byte offset) for each character of `text`; ember::Error from `op`
// saying that `subject` (the text, a file) is not valid UTF-8 where it is not.
template <typename Visit>
void for_each_char(std::string_view text, const char* op, const std::string& subject,
                   Visit&& visit) {
  for (size_t pos = 0; pos < text.size();) {
    const Decoded d = decode_one(text, pos);
    EMBER_CHECK(d.length != 0, op, subject, " is not valid UTF-8 at byte ", pos, " (bytes ",
                bytes_at(text, pos), ")");
    visit(d.code_point, pos);
    pos += d.length;
  }
}

std::string grouped(uint64_t v) { return detail::grouped(v); }

// "'a'" or "'a', 'b' and 2 more", for messages about a corpus of several files.
std::string name_files(const std::vector<std::string>& files) {
  std::string out;
  const size_t shown = std::min<size_t>(files.size(), 3);
  for (size_t i = 0; i < shown; ++i) out += (i ? ", '" : "'") + files[i] + "'";
  if (files.size() > shown) out += " and " + std::to_string(files.size() - shown) + " more";
  return out;
}

}  // namespace

// --- TextVocabulary --------------------------------------------------------------------------

TextVocabulary TextVocabulary::bytes() { return TextVocabulary(); }

TextVocabulary TextVocabulary::chars_of(std::string_view utf8) {
  std::vector<bool> seen(kMaxCodePoint + 1, false);
  for_each_char(utf8, "TextVocabulary::chars_of", "the text",
                [&](char32_t c, size_t) { seen[c] = true; });
  std::vector<char32_t> code_points;
  for (char32_t c = 0; c <= kMaxCodePoint; ++c)
    if (seen[c]) code_points.push_back(c);
  return TextVocabulary(std::move(code_points));
}

TextVocabulary::TextVocabulary(std::vector<char32_t> code_points)
    : kind_(Kind::kChar), code_points_(std::move(code_points)) {
  EMBER_CHECK(!code_points_.empty(), "TextVocabulary", "a character vocabulary needs at least ",
              "one character");
  for (size_t k = 0; k < code_points_.size(); ++k) {
    const char32_t c = code_points_[k];
    EMBER_CHECK(c <= kMaxCodePoint && !(c >= 0xD800 && c <= 0xDFFF), "TextVocabulary", "entry ", k,
                " (", static_cast<uint32_t>(c), ") is not a Unicode scalar value");
    EMBER_CHECK(k == 0 || code_points_[k - 1] < c, "TextVocabulary", "entry ", k, " (",
                describe_char(c), ") does not follow entry ", k - 1, " (",
                describe_char(code_points_[k - 1]), "): code points must be strictly increasing");
  }
}

int64_t TextVocabulary::size() const {
  return kind_ == Kind::kByte ? 256 : static_cast<int64_t>(code_points_.size());
}

std::vector<int64_t> TextVocabulary::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  if (kind_ == Kind::kByte) {
    ids.reserve(text.size());
    for (char c : text) ids.push_back(static_cast<uint8_t>(c));
    return ids;
  }
  for_each_char(text, "TextVocabulary::encode", "the text", [&](char32_t c, size_t pos) {
    const auto it = std::lower_bound(code_points_.begin(), code_points_.end(), c);
    EMBER_CHECK(it != code_points_.end() && *it == c, "TextVocabulary::encode", "character ",
                describe_char(c), " at byte ", pos, " is not in the vocabulary of ",
                code_points_.size(), " characters");
    ids.push_back(it - code_points_.begin());
  });
  return ids;
}

std::string TextVocabulary::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  const int64_t n = size();
  for (size_t i = 0; i < ids.size(); ++i) {
    EMBER_CHECK(ids[i] >= 0 && ids[i] < n, "TextVocabulary::decode", "id ", ids[i], " at position ",
                i, " is outside [0, ", n, ")");
    if (kind_ == Kind::kByte) {
      out += static_cast<char>(static_cast<uint8_t>(ids[i]));
    } else {
      append_utf8(out, code_points_[static_cast<size_t>(ids[i])]);
    }
  }
  return out;
}

std::string TextVocabulary::decode(const Tensor& ids) const {
  EMBER_CHECK(ids.defined() && is_integral(ids.dtype(), false), "TextVocabulary::decode",
              "ids must be an integer tensor, got ",
              ids.defined() ? dtype_name(ids.dtype()) : "an undefined tensor");
  return decode(ids.to(kCPU).to_vector<int64_t>());
}

void TextVocabulary::save(const std::string& path) const {
  std::string text = kVocabMagic;
  if (kind_ == Kind::kByte) {
    text += "byte 256\n";
  } else {
    text += "char " + std::to_string(code_points_.size()) + "\n";
    for (char32_t c : code_points_) append_utf8(text, c);
  }
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.close();
    EMBER_CHECK(out.good(), "TextVocabulary::save", "cannot write '", temp, "'");
  }
  std::error_code error;
  std::filesystem::rename(temp, path, error);
  EMBER_CHECK(!error, "TextVocabulary::save", "cannot rename '", temp, "' to '", path,
              "': ", error.message());
}

TextVocabulary TextVocabulary::load(const std::string& path) {
  constexpr const char* kOp = "TextVocabulary::load";
  const std::vector<uint8_t> raw = detail::read_file(
      path, kOp, kMaxVocabBytes, ", the size of a vocabulary of every code point");
  const std::string_view text(reinterpret_cast<const char*>(raw.data()), raw.size());
  const size_t newline = text.find('\n');
  const std::string_view header = text.substr(0, std::min(newline, size_t{80}));
  const std::string where = "'" + path + "' ";
  EMBER_CHECK(newline != std::string_view::npos && text.starts_with(kVocabMagic), kOp, where,
              "is not an ember vocabulary file (it should start with \"", kVocabMagic,
              "char N\" or \"", kVocabMagic, "byte 256\" and a newline)");
  const std::string_view kind = header.substr(std::string_view(kVocabMagic).size());
  const std::string_view body = text.substr(newline + 1);
  if (kind == "byte 256") {
    EMBER_CHECK(body.empty(), kOp, where, "has ", body.size(),
                " bytes after its \"byte 256\" header, which has none");
    return bytes();
  }
  EMBER_CHECK(kind.starts_with("char ") && kind.size() > 5 && kind.size() <= 12 &&
                  kind.substr(5).find_first_not_of("0123456789") == std::string_view::npos,
              kOp, where, "has header \"", header, "\": expected \"", kVocabMagic, "char N\" or \"",
              kVocabMagic, "byte 256\"");
  const int64_t count = std::stoll(std::string(kind.substr(5)));
  std::vector<char32_t> code_points;
  for_each_char(body, kOp, "'" + path + "'", [&](char32_t c, size_t) { code_points.push_back(c); });
  EMBER_CHECK(static_cast<int64_t>(code_points.size()) == count, kOp, where, "holds ",
              code_points.size(), " characters but its header says ", count);
  try {
    return TextVocabulary(std::move(code_points));
  } catch (const Error& e) {
    throw Error(ember::detail::str_cat(kOp, ": ", where, "is damaged: ", e.what()));
  }
}

// --- TextDataset -----------------------------------------------------------------------------

TextDataset::TextDataset(const char* name, std::vector<std::string> files, int64_t block_size,
                         TextVocabulary::Kind kind, TextDatasetOptions options)
    : name_(name),
      files_(std::move(files)),
      block_size_(block_size),
      vocabulary_(TextVocabulary::bytes()) {
  EMBER_CHECK(!files_.empty(), name, "no files given");
  EMBER_CHECK(block_size >= 1, name, "block_size must be >= 1, got ", block_size);
  EMBER_CHECK(!options.vocabulary || options.vocabulary->kind() == kind, name,
              "the vocabulary given is a ",
              kind == TextVocabulary::Kind::kChar ? "byte" : "character",
              " vocabulary; this dataset needs a ",
              kind == TextVocabulary::Kind::kChar ? "character" : "byte", " one");
  // Every file is checked (regular, within the size bound) before any is read.
  uint64_t total = 0;
  for (const auto& file : files_) {
    const uint64_t bytes = detail::RegularFile(file, name).size();
    total += bytes;
    EMBER_CHECK(total <= options.max_bytes, name, "'", file, "' has ", grouped(bytes),
                " bytes, which brings the corpus to ", grouped(total), " bytes, more than ",
                "TextDatasetOptions::max_bytes = ", grouped(options.max_bytes),
                " (the corpus is held in memory)");
  }
  // Each read is bounded by what is left of max_bytes, in case a file grew meanwhile.
  std::vector<std::vector<uint8_t>> contents;
  uint64_t left = options.max_bytes;
  for (const auto& file : files_) {
    contents.push_back(
        detail::read_file(file, name, left, ", what TextDatasetOptions::max_bytes leaves for it"));
    left -= contents.back().size();
  }
  const auto view = [&](size_t f) {
    return std::string_view(reinterpret_cast<const char*>(contents[f].data()), contents[f].size());
  };
  const auto quoted = [&](size_t f) { return "'" + files_[f] + "'"; };

  // Pass 1: the number of tokens per file (and, for characters, which occur).
  std::vector<bool> seen;
  if (kind == TextVocabulary::Kind::kChar && !options.vocabulary)
    seen.assign(kMaxCodePoint + 1, false);
  int64_t num_tokens = 0;
  for (size_t f = 0; f < files_.size(); ++f) {
    file_starts_.push_back(num_tokens);
    if (kind == TextVocabulary::Kind::kByte) {
      num_tokens += static_cast<int64_t>(contents[f].size());
      continue;
    }
    for_each_char(view(f), name, quoted(f), [&](char32_t c, size_t) {
      if (!seen.empty()) seen[c] = true;
      ++num_tokens;
    });
  }
  const char* unit = kind == TextVocabulary::Kind::kChar ? " characters" : " bytes";
  EMBER_CHECK(num_tokens >= block_size + 1, name, name_files(files_),
              files_.size() > 1 ? " have " : " has ", num_tokens, unit,
              files_.size() > 1 ? " in all" : "",
              ", too few for one window of block_size + 1 = ", block_size + 1, unit);
  if (options.vocabulary) {
    vocabulary_ = *options.vocabulary;
  } else if (kind == TextVocabulary::Kind::kChar) {
    std::vector<char32_t> code_points;
    for (char32_t c = 0; c <= kMaxCodePoint; ++c)
      if (seen[c]) code_points.push_back(c);
    vocabulary_ = TextVocabulary(std::move(code_points));
  }

  // Pass 2: the ids.
  const bool small = vocabulary_.size() <= 256;
  tokens_ = empty({num_tokens}, small ? kU8 : kI32);
  uint8_t* u8 = small ? tokens_.data_ptr<uint8_t>() : nullptr;
  int32_t* i32 = small ? nullptr : tokens_.data_ptr<int32_t>();
  int64_t t = 0;
  const auto put = [&](int64_t id) {
    if (small) {
      u8[t++] = static_cast<uint8_t>(id);
    } else {
      i32[t++] = static_cast<int32_t>(id);
    }
  };
  const auto& vocab = vocabulary_.code_points();
  for (size_t f = 0; f < files_.size(); ++f) {
    if (kind == TextVocabulary::Kind::kByte) {
      for (uint8_t b : contents[f]) put(b);
      continue;
    }
    for_each_char(view(f), name, quoted(f), [&](char32_t c, size_t pos) {
      const auto it = std::lower_bound(vocab.begin(), vocab.end(), c);
      EMBER_CHECK(it != vocab.end() && *it == c, name, "'", files_[f], "' has character ",
                  describe_char(c), " at byte ", pos, ", which is not in the given vocabulary of ",
                  vocab.size(), " characters");
      put(it - vocab.begin());
    });
  }
}

Example TextDataset::get(int64_t index) const {
  check_index(index, name_);
  const Tensor window = tokens_.narrow(0, index, block_size_ + 1).to(kI64);
  return {window.narrow(0, 0, block_size_), 0, window.narrow(0, 1, block_size_)};
}

std::string TextDataset::describe(int64_t index) const {
  if (index < 0 || index >= size()) return {};
  const auto after = std::upper_bound(file_starts_.begin(), file_starts_.end(), index);
  const size_t f = static_cast<size_t>(after - file_starts_.begin()) - 1;
  return ember::detail::str_cat("'", files_[f], "' from token ", index - file_starts_[f]);
}

CharDataset::CharDataset(const std::string& path, int64_t block_size, TextDatasetOptions options)
    : CharDataset(std::vector<std::string>{path}, block_size, std::move(options)) {}

CharDataset::CharDataset(std::vector<std::string> paths, int64_t block_size,
                         TextDatasetOptions options)
    : TextDataset("CharDataset", std::move(paths), block_size, TextVocabulary::Kind::kChar,
                  std::move(options)) {}

ByteDataset::ByteDataset(const std::string& path, int64_t block_size, TextDatasetOptions options)
    : ByteDataset(std::vector<std::string>{path}, block_size, std::move(options)) {}

ByteDataset::ByteDataset(std::vector<std::string> paths, int64_t block_size,
                         TextDatasetOptions options)
    : TextDataset("ByteDataset", std::move(paths), block_size, TextVocabulary::Kind::kByte,
                  std::move(options)) {}

// --- the fortunes corpus ---------------------------------------------------------------------

std::vector<std::string> fortune_files(const std::string& root) {
  namespace fs = std::filesystem;
  std::error_code error;
  EMBER_CHECK(fs::is_directory(root, error), "fortune_files", "'", root,
              "' is not a folder: install Debian's fortunes package (apt-get install fortunes), "
              "or pass the folder holding the fortune files");
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(root, error)) {
    const std::string file = entry.path().filename().string();
    if (file.ends_with(".dat") || file.ends_with(".u8") || file.starts_with(".")) continue;
    if (!entry.is_regular_file(error) || entry.is_symlink(error)) continue;
    files.push_back(entry.path().string());
  }
  EMBER_CHECK(!error, "fortune_files", "cannot list '", root, "': ", error.message());
  EMBER_CHECK(!files.empty(), "fortune_files", "'", root,
              "' holds no fortune files (only *.dat indexes, *.u8 links or folders)");
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace ember::data
