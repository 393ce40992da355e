// The safetensors file format, in one place for every ember checkpoint file (checkpoint.cpp's
// whole checkpoints, sharded_checkpoint.cpp's shards): an 8-byte little-endian header length,
// a JSON header giving each tensor's dtype, shape and data_offsets (and string metadata under
// "__metadata__"), then the raw little-endian data. Writing is atomic; reading treats the file
// as untrusted: every length and offset is bounded by the file's size before anything is sized
// from it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <ember/tensor/tensor.h>

namespace ember::dist::detail {

// "op: path: parts...": the form of every error about a checkpoint file.
template <typename... Parts>
Error file_error(const std::string& op, const std::string& path, const Parts&... parts) {
  return Error(ember::detail::str_cat(op, ": ", path, ": ", parts...));
}

// The dtype's safetensors name ("F32", "I64", ...).
const char* safetensors_dtype(DType t);

// The dtype named `name` in a safetensors header; false when there is none.
bool parse_safetensors_dtype(const std::string& name, DType& out);

// A shape from untrusted JSON: a list of unsigned sizes whose element count (and product of
// nonzero sizes, which the strides reach) fits in an int64_t; false otherwise.
bool parse_shape(const nlohmann::json& sizes, Shape& shape, int64_t& numel);

// Numbers in metadata strings: doubles exactly ("%.17g"), counts as plain decimal digits. The
// parsers take the whole string or fail.
std::string format_number(double v);
bool parse_number(const std::string& s, double& out);
bool parse_count(const std::string& s, uint64_t& out);

// FNV-1a over `n` bytes, continuing from `h`: the data checksums kept in the metadata.
inline constexpr uint64_t kChecksumSeed = 14695981039346656037ull;
uint64_t checksum(const char* data, size_t n, uint64_t h = kChecksumSeed);

// The bytes of a safetensors file holding `tensors` (any device; written as contiguous host
// data, in name order) and `metadata`, to which "format" = `format` and "checksum" (of the
// whole data region) are added.
std::vector<char> serialize_safetensors(const std::map<std::string, Tensor>& tensors,
                                        std::map<std::string, std::string> metadata,
                                        const std::string& format);

// Writes `bytes` to `path` so that readers see the old file or the whole new one: a temporary
// PATH.tmp.PID in the same folder, locked while written, fsync, rename, fsync of the folder.
// Temporaries in the folder that no writer holds any more are removed first. Errors start
// with `op`.
void write_atomically(const std::string& op, const std::string& path,
                      const std::vector<char>& bytes);

// One tensor of a header; begin and end are byte offsets in the data region.
struct SafetensorsEntry {
  std::string name;
  DType dtype = kF32;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

// A safetensors file opened for reading. The constructor reads the header alone and checks it
// (at most safetensors' 100 MB; valid JSON; known dtypes; every shape's size matching its
// data_offsets; the tensors covering the data region without gaps or overlaps; the data region
// within the file), throwing file_error(op, path, ...) naming the field. Data is read by range.
class SafetensorsFile {
 public:
  SafetensorsFile(std::string op, std::string path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // The operation its errors name.
  const std::string& op() const { return op_; }
  // Ordered by data offset.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  // The entry named `name`, or null.
  const SafetensorsEntry* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t data_size() const { return data_size_; }
  // Copies bytes [begin, begin + n) of the data region to `dst`; a file that got shorter
  // since the header was read is an error naming it.
  void read(uint64_t begin, void* dst, uint64_t n) const;

 private:
  void read_at(uint64_t offset, void* dst, uint64_t n) const;
  void parse_header(const std::string& text);

  std::string op_, path_;
  int fd_ = -1;
  uint64_t data_start_ = 0, data_size_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace ember::dist::detail
