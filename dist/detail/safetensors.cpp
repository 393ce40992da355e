#include "safetensors.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <tuple>

namespace ember::dist::detail {

static_assert(std::endian::native == std::endian::little,
              "checkpoints store raw little-endian data");

namespace {

// Python's safetensors refuses longer headers; so does ember, before allocating one.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::string system_error(const std::string& op, const std::string& what, const std::string& path) {
  return ember::detail::str_cat(op, ": ", what, " ", path, ": ", std::strerror(errno));
}

void write_all(const std::string& op, int fd, const char* data, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const std::string message = system_error(op, "cannot write", path);
      ::close(fd);
      ::unlink(path.c_str());
      throw Error(message);
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
}

using FileStatus = struct stat;

bool same_file(const FileStatus& a, const FileStatus& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// NAME.tmp.DIGITS: what write_atomically writes before the rename.
bool is_temporary_name(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  if (at == std::string::npos || at == 0 || at + 5 == name.size()) return false;
  return std::all_of(name.begin() + static_cast<std::ptrdiff_t>(at + 5), name.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

// Creates `tmp` and takes its lock (held until the descriptor closes, by exit or death
// included), so that no other save removes it as stale while it is written.
int create_locked(const std::string& op, const std::string& tmp) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw Error(system_error(op, "cannot create", tmp));
    if (::flock(fd, LOCK_EX) != 0) {
      // A file system without locks: written unlocked, and no save takes a temporary file
      // there for stale (their lock cannot be taken either).
      if (errno == ENOLCK || errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL) return fd;
      const std::string message = system_error(op, "cannot lock", tmp);
      ::close(fd);
      throw Error(message);
    }
    FileStatus by_fd{}, by_path{};
    if (::fstat(fd, &by_fd) == 0 && ::stat(tmp.c_str(), &by_path) == 0 && same_file(by_fd, by_path))
      return fd;
    ::close(fd);  // another save took it for stale between the open and the lock: again
  }
  throw Error(ember::detail::str_cat(op, ": cannot keep the temporary file ", tmp,
                                     " (removed again and again while it was being created)"));
}

// Removes the temporary files in `dir` that no writer holds (their writer died mid-save).
void remove_stale_temporaries(const std::filesystem::path& dir, const std::string& own) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const fs::path path = it->path();
    const std::string name = path.filename().string();
    if (!is_temporary_name(name) || path.string() == own) continue;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    FileStatus by_fd{}, by_path{};
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::fstat(fd, &by_fd) == 0 && S_ISREG(by_fd.st_mode) &&
        ::lstat(path.c_str(), &by_path) == 0 && same_file(by_fd, by_path))
      ::unlink(path.c_str());
    ::close(fd);
  }
}

// a * b, or false when it does not fit in an int64_t.
bool multiply(uint64_t a, uint64_t b, uint64_t& out) {
  constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (a != 0 && b > kMax / a) return false;
  out = a * b;
  return true;
}

}  // namespace

bool parse_safetensors_dtype(const std::string& name, DType& out) {
  for (DType t : {kF32, kF64, kF16, kBF16, kI64, kI32, kU8, kBool}) {
    if (name == safetensors_dtype(t)) {
      out = t;
      return true;
    }
  }
  return false;
}

bool parse_shape(const nlohmann::json& sizes, Shape& shape, int64_t& numel) {
  if (!sizes.is_array()) return false;
  uint64_t count = 1, extent = 1;
  shape.clear();
  for (const auto& s : sizes) {
    if (!s.is_number_unsigned()) return false;
    const auto size = s.get<uint64_t>();
    if (!multiply(extent, std::max<uint64_t>(size, 1), extent)) return false;
    count *= size;  // at most extent
    shape.push_back(static_cast<int64_t>(size));
  }
  numel = static_cast<int64_t>(count);
  return true;
}

std::string format_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

bool parse_number(const std::string& s, double& out) {
  try {
    size_t used = 0;
    out = std::stod(s, &used);
    return used == s.size();
  } catch (const std::exception&) {
    return false;
  }
}

bool parse_count(const std::string& s, uint64_t& out) {
  if (s.empty() || s.size() > 20 ||
      !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  errno = 0;
  out = std::strtoull(s.c_str(), nullptr, 10);
  return errno == 0;
}

const char* safetensors_dtype(DType t) {
  switch (t) {
    case kF32:
      return "F32";
    case kF64:
      return "F64";
    case kF16:
      return "F16";
    case kBF16:
      return "BF16";
    case kI64:
      return "I64";
    case kI32:
      return "I32";
    case kU8:
      return "U8";
    case kBool:
      return "BOOL";
  }
  return "?";
}

uint64_t checksum(const char* data, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(data[i])) * 1099511628211ull;
  return h;
}

std::vector<char> serialize_safetensors(const std::map<std::string, Tensor>& tensors,
                                        std::map<std::string, std::string> metadata,
                                        const std::string& format) {
  nlohmann::json header = nlohmann::json::object();
  std::vector<char> data;
  for (const auto& [name, t] : tensors) {
    const Tensor host = t.detach().to(kCPU).contiguous();
    const size_t begin = data.size();
    const auto* p = static_cast<const char*>(host.data_ptr());
    if (host.nbytes() > 0) data.insert(data.end(), p, p + host.nbytes());
    header[name] = {{"dtype", safetensors_dtype(host.dtype())},
                    {"shape", host.sizes()},
                    {"data_offsets", {begin, data.size()}}};
  }
  metadata["format"] = format;
  metadata["checksum"] = std::to_string(checksum(data.data(), data.size()));
  header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  const uint64_t length = text.size();
  std::vector<char> out(8 + text.size() + data.size());
  std::memcpy(out.data(), &length, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + text.size(), data.data(), data.size());
  return out;
}

void write_atomically(const std::string& op, const std::string& path,
                      const std::vector<char>& bytes) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string tmp =
      (dir / (target.filename().string() + ".tmp." + std::to_string(::getpid()))).string();
  const int fd = create_locked(op, tmp);
  remove_stale_temporaries(dir, tmp);  // before writing: their space may be needed
  write_all(op, fd, bytes.data(), bytes.size(), tmp);
  if (::fsync(fd) != 0) {
    const std::string message = system_error(op, "cannot fsync", tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(message);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string message = system_error(op, "cannot rename " + tmp + " to", path);
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(message);
  }
  ::close(fd);  // the lock is held until the rename: the file is never taken for stale
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // makes the rename durable; best effort where directories cannot sync
    ::close(dfd);
  }
}

SafetensorsFile::SafetensorsFile(std::string op, std::string path)
    : op_(std::move(op)), path_(std::move(path)) {
  auto fail = [this](const auto&... parts) { return file_error(op_, path_, parts...); };
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw fail("cannot open the file (", std::strerror(errno), ")");
  try {
    FileStatus st{};
    if (::fstat(fd_, &st) != 0) throw fail("cannot stat the file (", std::strerror(errno), ")");
    if (!S_ISREG(st.st_mode)) throw fail("not a regular file");
    const auto file_size = static_cast<uint64_t>(st.st_size);
    if (file_size < 8)
      throw fail("the file is ", file_size, " bytes, too short for a safetensors header");
    uint64_t length = 0;
    read_at(0, &length, 8);
    if (length > file_size - 8)
      throw fail("the header claims ", length, " bytes but the file holds only ", file_size - 8,
                 " after the length (truncated or not a checkpoint)");
    if (length > kMaxHeaderBytes)
      throw fail("the header claims ", length, " bytes, more than safetensors' limit of ",
                 kMaxHeaderBytes);
    data_start_ = 8 + length;
    data_size_ = file_size - data_start_;
    std::string text(length, '\0');
    read_at(8, text.data(), length);
    parse_header(text);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() { ::close(fd_); }

void SafetensorsFile::read_at(uint64_t offset, void* dst, uint64_t n) const {
  auto* out = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd_, out, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw file_error(op_, path_, "cannot read (", std::strerror(errno), ")");
    if (got == 0)
      throw file_error(op_, path_, "the file ends at byte ", offset,
                       " (truncated while it was being read)");
    out += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
}

void SafetensorsFile::read(uint64_t begin, void* dst, uint64_t n) const {
  if (begin > data_size_ || n > data_size_ - begin)
    throw file_error(op_, path_, "bytes [", begin, ", ", begin + n,
                     ") are outside the data region of ", data_size_, " bytes");
  read_at(data_start_ + begin, dst, n);
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  for (const SafetensorsEntry& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

void SafetensorsFile::parse_header(const std::string& text) {
  auto fail = [this](const auto&... parts) { return file_error(op_, path_, parts...); };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw fail("the header is not valid JSON (", e.what(), ")");
  }
  if (!header.is_object()) throw fail("the header is not a JSON object");
  if (header.contains("__metadata__")) {
    const auto& meta = header["__metadata__"];
    if (!meta.is_object()) throw fail("__metadata__ is not an object");
    for (const auto& [key, value] : meta.items()) {
      if (!value.is_string()) throw fail("metadata \"", key, "\" is not a string");
      metadata_[key] = value.get<std::string>();
    }
  }
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") ||
        !info.contains("data_offsets"))
      throw fail("tensor \"", name, "\" lacks dtype, shape or data_offsets");
    SafetensorsEntry e{name, kF32, {}, 0, 0};
    if (!info["dtype"].is_string() ||
        !parse_safetensors_dtype(info["dtype"].get<std::string>(), e.dtype))
      throw fail("tensor \"", name, "\" has unknown dtype ", info["dtype"].dump());
    if (!info["shape"].is_array())
      throw fail("tensor \"", name, "\" has a shape that is not a list");
    int64_t numel = 0;
    if (!parse_shape(info["shape"], e.shape, numel))
      throw fail("tensor \"", name, "\" has shape ", info["shape"].dump());
    uint64_t bytes = 0;
    if (!multiply(static_cast<uint64_t>(numel), element_size(e.dtype), bytes))
      throw fail("tensor \"", name, "\" has shape ", info["shape"].dump(), ", too large");
    const auto& offsets = info["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      throw fail("tensor \"", name, "\" has data_offsets ", offsets.dump());
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_size_)
      throw fail("tensor \"", name, "\" has data_offsets [", e.begin, ", ", e.end,
                 "] outside the data region of ", data_size_, " bytes (truncated file?)");
    if (e.end - e.begin != bytes)
      throw fail("tensor \"", name, "\" of shape ", shape_str(e.shape), " and dtype ",
                 info["dtype"].get<std::string>(), " needs ", bytes,
                 " bytes but data_offsets span ", e.end - e.begin);
    entries_.push_back(std::move(e));
  }
  std::sort(entries_.begin(), entries_.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);  // empty tensors first
            });
  uint64_t cursor = 0;
  for (const SafetensorsEntry& e : entries_) {
    if (e.begin != cursor)
      throw fail("tensor \"", e.name, "\" starts at byte ", e.begin,
                 " but the previous one ends at ", cursor,
                 " (data must be contiguous, without gaps or overlaps)");
    cursor = e.end;
  }
  if (cursor != data_size_)
    throw fail("the tensors cover ", cursor, " bytes of a data region of ", data_size_, " bytes");
}

}  // namespace ember::dist::detail
