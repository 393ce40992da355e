// File reading shared by the dataset parsers (private). Nothing here uses Tensor, so the
// fuzz harnesses (tests/data/fuzz/) compile these parsers on their own.
//
// Every reader opens a path once, refuses anything but a regular file without blocking
// (FIFOs, devices, directories, sockets), checks the file's size against what its header
// implies before reading it, and never allocates more than the file can justify. Every
// failure, std::bad_alloc included, is an ember::Error naming the operation and the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace ember::data::detail {

// std::filesystem::exists, but false (not an exception) when the status cannot be read.
bool exists_no_throw(const std::filesystem::path& path);

// An open regular file (closed on destruction).
class RegularFile {
 public:
  // Opens `path` without blocking and checks with fstat on the opened descriptor that it is
  // a regular file; ember::Error naming `op`, `path` and what it is otherwise.
  RegularFile(const std::string& path, const char* op);
  ~RegularFile();
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  uint64_t size() const { return size_; }
  uint64_t position() const { return position_; }  // bytes read so far
  // Reads up to n bytes from the current position; fewer only at the end of the file.
  size_t read_some(uint8_t* dst, size_t n);
  // Reads exactly n bytes; ember::Error ("truncated at byte N") when the file ends first.
  void read_exact(uint8_t* dst, size_t n);

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
  uint64_t position_ = 0;
  std::string path_;
  const char* op_;
};

// The whole file, refused before reading when it is larger than `max_bytes` (`limit_reason`
// ends that message: why the limit holds).
std::vector<uint8_t> read_file(const std::string& path, const char* op, uint64_t max_bytes,
                               const std::string& limit_reason);

// Reads an idx file of u8 elements, raw or gzip-compressed (recognised by its magic bytes
// 1f 8b, concatenated members allowed). `allocate(dims)` is called once the header is read
// and returns where the elements go; raw files are checked against the header's size before
// any element is read, gzip streams stop with an error as soon as they inflate past it.
using IdxAllocate = std::function<uint8_t*(const std::vector<int64_t>& dims)>;
void read_idx_file(const std::string& path, const char* op, const IdxAllocate& allocate);

// Appends the records of one CIFAR binary file (each: `limits.size()` label bytes checked
// against `limits`, then 32x32 red, green and blue planes) to `pixels` as HWC and to
// `labels`. Files larger than `max_records` records are refused before reading.
void read_cifar_file(const std::string& path, const char* op, const std::vector<int64_t>& limits,
                     int64_t max_records, std::vector<uint8_t>& pixels,
                     std::vector<std::vector<int64_t>>& labels);

// Formats a byte count with thousands separators: 30,730,000.
std::string grouped(uint64_t value);

}  // namespace ember::data::detail
