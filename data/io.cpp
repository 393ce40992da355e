#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>

#include <ember/tensor/error.h>

#include "detail/io.h"

namespace ember::data::detail {
namespace {

// What a non-regular file is, for the message refusing it.
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

[[noreturn]] void refuse_kind(const std::string& path, const char* op, mode_t mode) {
  throw Error(ember::detail::str_cat(op, ": '", path, "' is ", file_kind(mode),
                                     ", not a regular file; ember reads data only from "
                                     "regular files"));
}

std::string hex32(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08x", value);
  return text;
}

uint32_t big_endian_u32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// Runs `allocate`, turning std::bad_alloc into an ember::Error naming the file.
template <typename F>
auto allocating(const std::string& path, const char* op, uint64_t bytes, F&& allocate) {
  try {
    return allocate();
  } catch (const std::bad_alloc&) {
    throw Error(ember::detail::str_cat(op, ": '", path, "' needs ", grouped(bytes),
                                       " bytes, more memory than could be allocated"));
  } catch (const std::length_error&) {
    throw Error(ember::detail::str_cat(op, ": '", path, "' needs ", grouped(bytes),
                                       " bytes, more memory than could be allocated"));
  }
}

// Deflate cannot expand data more than 1032-fold (a 258-byte match per ~2 bits).
constexpr uint64_t kMaxDeflateRatio = 1032;

// The bytes of an idx file: the file itself, or what its gzip members inflate to.
class IdxSource {
 public:
  IdxSource(RegularFile& file, const std::string& path, const char* op)
      : file_(file), path_(path), op_(op) {
    in_size_ = file_.read_some(in_, std::min<size_t>(sizeof(in_), 2));
    gzip_ = in_size_ == 2 && in_[0] == 0x1f && in_[1] == 0x8b;
    if (gzip_) {
      EMBER_CHECK(inflateInit2(&zs_, 16 + MAX_WBITS) == Z_OK, op_,
                  "zlib could not start inflating '", path_, "'");
      zs_.next_in = in_;
      zs_.avail_in = static_cast<uInt>(in_size_);
    }
  }
  ~IdxSource() {
    if (gzip_) inflateEnd(&zs_);
  }
  IdxSource(const IdxSource&) = delete;
  IdxSource& operator=(const IdxSource&) = delete;

  bool gzip() const { return gzip_; }
  uint64_t produced() const { return produced_; }

  // Up to n bytes; fewer only at the end of the data.
  size_t read(uint8_t* dst, size_t n) {
    size_t got = 0;
    if (!gzip_) {
      const size_t from_prefix = std::min(n, in_size_ - in_pos_);
      std::memcpy(dst, in_ + in_pos_, from_prefix);
      in_pos_ += from_prefix;
      got = from_prefix + file_.read_some(dst + from_prefix, n - from_prefix);
    } else {
      got = inflate_some(dst, n);
    }
    produced_ += got;
    return got;
  }

 private:
  size_t inflate_some(uint8_t* dst, size_t n) {
    size_t got = 0;
    while (got < n && !finished_) {
      if (zs_.avail_in == 0) {
        zs_.next_in = in_;
        zs_.avail_in = static_cast<uInt>(file_.read_some(in_, sizeof(in_)));
        in_eof_ = zs_.avail_in == 0;
      }
      const size_t chunk = std::min<size_t>(n - got, std::numeric_limits<uInt>::max());
      zs_.next_out = dst + got;
      zs_.avail_out = static_cast<uInt>(chunk);
      const int status = inflate(&zs_, Z_NO_FLUSH);
      const size_t written = chunk - zs_.avail_out;
      got += written;
      if (status == Z_STREAM_END) {
        // Concatenated gzip members inflate to the concatenation of their contents.
        if (zs_.avail_in == 0) {
          zs_.next_in = in_;
          zs_.avail_in = static_cast<uInt>(file_.read_some(in_, sizeof(in_)));
        }
        if (zs_.avail_in == 0) {
          finished_ = true;
          break;
        }
        // A member's first bytes may straddle two reads.
        if (zs_.avail_in == 1) {
          in_[0] = zs_.next_in[0];
          zs_.avail_in = static_cast<uInt>(1 + file_.read_some(in_ + 1, sizeof(in_) - 1));
          zs_.next_in = in_;
        }
        const bool another = zs_.avail_in >= 2 && zs_.next_in[0] == 0x1f && zs_.next_in[1] == 0x8b;
        EMBER_CHECK(another, op_, "'", path_,
                    "' has trailing bytes after its gzip stream (at byte ", consumed(), " of ",
                    file_.size(), ")");
        inflateReset(&zs_);
        continue;
      }
      EMBER_CHECK(status == Z_OK || status == Z_BUF_ERROR, op_, "'", path_,
                  "' is not valid gzip data (zlib: ", zs_.msg ? zs_.msg : zError(status),
                  ", at compressed byte ", consumed(), " of ", file_.size(), ")");
      EMBER_CHECK(!(in_eof_ && zs_.avail_in == 0 && written == 0), op_, "'", path_,
                  "' is truncated at byte ", file_.size(),
                  ": its gzip stream ends before the end of "
                  "the compressed data (",
                  grouped(produced_ + got), " bytes inflated)");
    }
    return got;
  }
  // The compressed bytes inflate has consumed (for positions in messages).
  uint64_t consumed() const { return file_.position() - zs_.avail_in; }

  RegularFile& file_;
  const std::string& path_;
  const char* op_;
  uint8_t in_[1 << 16];
  size_t in_size_ = 0, in_pos_ = 0;
  bool gzip_ = false, finished_ = false, in_eof_ = false;
  z_stream zs_{};
  uint64_t produced_ = 0;
};

}  // namespace

bool exists_no_throw(const std::filesystem::path& path) {
  std::error_code error;
  return std::filesystem::exists(path, error);
}

std::string grouped(uint64_t value) {
  std::string digits = std::to_string(value), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

RegularFile::RegularFile(const std::string& path, const char* op) : path_(path), op_(op) {
  // stat first, so that devices are never opened; the decision is fstat's, on the opened
  // descriptor, so that a file swapped in between is caught too.
  struct stat info {};
  EMBER_CHECK(::stat(path.c_str(), &info) == 0, op, "cannot open '", path,
              "': ", std::strerror(errno));
  if (!S_ISREG(info.st_mode)) refuse_kind(path, op, info.st_mode);
  do {
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  } while (fd_ < 0 && errno == EINTR);
  EMBER_CHECK(fd_ >= 0, op, "cannot open '", path, "': ", std::strerror(errno));
  if (::fstat(fd_, &info) != 0 || !S_ISREG(info.st_mode)) {
    const int saved = errno;
    ::close(fd_);
    fd_ = -1;
    EMBER_CHECK(S_ISREG(info.st_mode), op, "'", path, "' is ", file_kind(info.st_mode),
                ", not a regular file; ember reads data only from regular files");
    throw Error(ember::detail::str_cat(op, ": cannot stat '", path, "': ", std::strerror(saved)));
  }
  size_ = static_cast<uint64_t>(info.st_size);
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

size_t RegularFile::read_some(uint8_t* dst, size_t n) {
  size_t got = 0;
  while (got < n) {
    const size_t want = std::min<size_t>(n - got, size_t{1} << 30);
    const ssize_t r = ::read(fd_, dst + got, want);
    if (r < 0 && errno == EINTR) continue;
    EMBER_CHECK(r >= 0, op_, "error reading '", path_, "' at byte ", position_, ": ",
                std::strerror(errno));
    if (r == 0) break;
    got += static_cast<size_t>(r);
    position_ += static_cast<uint64_t>(r);
  }
  return got;
}

void RegularFile::read_exact(uint8_t* dst, size_t n) {
  const uint64_t start = position_;
  const size_t got = read_some(dst, n);
  EMBER_CHECK(got == n, op_, "'", path_, "' is truncated at byte ", start + got, " of ", start + n,
              " (it was ", grouped(size_), " bytes when opened: did it change while ",
              "being read?)");
}

std::vector<uint8_t> read_file(const std::string& path, const char* op, uint64_t max_bytes,
                               const std::string& limit_reason) {
  RegularFile file(path, op);
  EMBER_CHECK(file.size() <= max_bytes, op, "'", path, "' has ", grouped(file.size()),
              " bytes, more than ", grouped(max_bytes), limit_reason);
  auto bytes = allocating(path, op, file.size(),
                          [&] { return std::vector<uint8_t>(static_cast<size_t>(file.size())); });
  file.read_exact(bytes.data(), bytes.size());
  return bytes;
}

void read_idx_file(const std::string& path, const char* op, const IdxAllocate& allocate) {
  RegularFile file(path, op);
  EMBER_CHECK(file.size() > 0, op, "'", path, "' is empty (0 bytes)");
  IdxSource source(file, path, op);
  const char* holds = source.gzip() ? " it inflates to " : " ";
  uint8_t head[4] = {};
  const size_t got = source.read(head, 4);
  EMBER_CHECK(got == 4, op, "'", path, "' is truncated:", holds, got,
              " bytes, fewer than the 4-byte idx magic number");
  const uint32_t magic = big_endian_u32(head);
  EMBER_CHECK(head[0] == 0 && head[1] == 0 && head[3] >= 1, op, "'", path,
              "' has wrong magic number ", hex32(magic),
              ": not an idx file (expected 0x000008NN, e.g. 0x00000803 for images)");
  EMBER_CHECK(head[2] == 0x08, op, "'", path, "' has magic number ", hex32(magic),
              ": element type ", hex32(head[2]),
              " is not supported (ember reads u8 idx files, type 0x08)");
  const size_t ndim = head[3];
  const uint64_t header = 4 + 4 * ndim;
  uint8_t dims_bytes[4 * 255];
  const size_t got_dims = source.read(dims_bytes, 4 * ndim);
  EMBER_CHECK(got_dims == 4 * ndim, op, "'", path, "' is truncated:", holds, 4 + got_dims,
              " bytes, fewer than the ", header, "-byte header of a ", ndim,
              "-d idx file (magic number ", hex32(magic), ")");
  std::vector<int64_t> dims;
  uint64_t expected = 1;
  bool too_large = false;
  std::string dims_text = "[";
  for (size_t d = 0; d < ndim; ++d) {
    const uint32_t size = big_endian_u32(dims_bytes + 4 * d);
    dims.push_back(size);
    dims_text += (d ? ", " : "") + std::to_string(size);
    // Stop multiplying before the product overflows: the file is then too short anyway.
    if (!too_large) {
      if (size != 0 && expected > (uint64_t{1} << 62) / size) too_large = true;
      expected *= size;
    }
  }
  dims_text += "]";
  const std::string need = too_large ? std::string("more than 2^62") : grouped(expected);
  if (!source.gzip()) {
    const uint64_t data_bytes = file.size() - header;
    EMBER_CHECK(!too_large && expected == data_bytes, op, "'", path, "' has ", grouped(data_bytes),
                " bytes after its header but its dims ", dims_text, " need ", need,
                data_bytes < expected || too_large ? ": the file is truncated"
                                                   : ": the file has trailing bytes");
  } else {
    const uint64_t bound = kMaxDeflateRatio * file.size();
    EMBER_CHECK(!too_large && header + expected <= bound, op, "'", path, "' has dims ", dims_text,
                " (", need, " bytes), but its ", grouped(file.size()),
                " compressed bytes cannot inflate to more than ", grouped(bound),
                " (deflate expands at most 1032-fold): the header is corrupt");
  }
  uint8_t* out = allocating(path, op, expected, [&] { return allocate(dims); });
  const size_t got_data = expected == 0 ? 0 : source.read(out, static_cast<size_t>(expected));
  EMBER_CHECK(got_data == expected, op, "'", path, "' is truncated: it inflates to ",
              grouped(header + got_data), " bytes but its dims ", dims_text, " need ",
              grouped(header + expected));
  if (source.gzip()) {
    uint8_t extra = 0;
    EMBER_CHECK(source.read(&extra, 1) == 0, op, "'", path, "' inflates to more than the ",
                grouped(header + expected), " bytes its dims ", dims_text,
                " imply: the file has trailing data");
  }
}

void read_cifar_file(const std::string& path, const char* op, const std::vector<int64_t>& limits,
                     int64_t max_records, std::vector<uint8_t>& pixels,
                     std::vector<std::vector<int64_t>>& labels) {
  constexpr size_t kSide = 32, kPlane = kSide * kSide, kPixels = 3 * kPlane;
  RegularFile file(path, op);
  const size_t label_bytes = limits.size();
  const uint64_t record = label_bytes + kPixels;
  const uint64_t max_bytes = static_cast<uint64_t>(max_records) * record;
  EMBER_CHECK(file.size() > 0 && file.size() % record == 0, op, "'", path, "' has ",
              grouped(file.size()), " bytes, not a whole number of ", record, "-byte records (",
              label_bytes, " label byte", label_bytes == 1 ? "" : "s", " + ", kPixels,
              " pixels): truncated, or not this dataset's binary version");
  EMBER_CHECK(file.size() <= max_bytes, op, "'", path, "' has ", grouped(file.size()),
              " bytes, more than the ", grouped(max_bytes), " of the ", grouped(max_records),
              " records this file holds in the dataset");
  const size_t count = static_cast<size_t>(file.size() / record);
  const size_t base = pixels.size();
  allocating(path, op, count * kPixels, [&] {
    pixels.resize(base + count * kPixels);
    for (auto& l : labels) l.reserve(l.size() + count);
    return 0;
  });
  std::vector<uint8_t> chunk(static_cast<size_t>(record) * 256);
  for (size_t r0 = 0; r0 < count; r0 += 256) {
    const size_t n = std::min<size_t>(256, count - r0);
    file.read_exact(chunk.data(), n * record);
    for (size_t i = 0; i < n; ++i) {
      const size_t r = r0 + i;
      const uint8_t* rec = chunk.data() + i * record;
      for (size_t k = 0; k < label_bytes; ++k) {
        EMBER_CHECK(rec[k] < limits[k], op, "'", path, "' record ", r, " has label ",
                    static_cast<int>(rec[k]), ", outside [0, ", limits[k], ")");
        labels[k].push_back(rec[k]);
      }
      // Planes R, G, B of 1,024 pixels each -> interleaved HWC.
      const uint8_t* planes = rec + label_bytes;
      uint8_t* out = pixels.data() + base + r * kPixels;
      for (size_t p = 0; p < kPlane; ++p) {
        out[p * 3] = planes[p];
        out[p * 3 + 1] = planes[kPlane + p];
        out[p * 3 + 2] = planes[2 * kPlane + p];
      }
    }
  }
}

}  // namespace ember::data::detail
