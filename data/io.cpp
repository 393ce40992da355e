#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

#include <ember/tensor/error.h>

#include "detail/io.h"

namespace ember::data::detail {

bool exists_no_throw(const std::filesystem::path& path) {
  std::error_code error;
  return std::filesystem::exists(path, error);
}

std::vector<uint8_t> read_file(const std::string& path, const char* op) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  EMBER_CHECK(file != nullptr, op, "cannot open '", path, "': ", std::strerror(errno));
  std::vector<uint8_t> bytes;
  uint8_t chunk[1 << 16];
  for (;;) {
    const size_t n = std::fread(chunk, 1, sizeof(chunk), file.get());
    bytes.insert(bytes.end(), chunk, chunk + n);
    if (n < sizeof(chunk)) break;
  }
  EMBER_CHECK(!std::ferror(file.get()), op, "error reading '", path, "': ", std::strerror(errno));
  return bytes;
}

std::vector<uint8_t> maybe_gunzip(std::vector<uint8_t> bytes, const std::string& path,
                                  const char* op) {
  if (bytes.size() < 2 || bytes[0] != 0x1f || bytes[1] != 0x8b) return bytes;
  // Anything larger than this is corrupt, not a dataset ember can hold in memory.
  constexpr size_t kMaxOutput = size_t{1} << 34;
  constexpr size_t kMaxChunk = std::numeric_limits<uInt>::max();
  z_stream zs{};
  EMBER_CHECK(inflateInit2(&zs, 16 + MAX_WBITS) == Z_OK, op, "zlib could not start inflating '",
              path, "'");
  std::unique_ptr<z_stream, int (*)(z_stream*)> guard(&zs, &inflateEnd);
  std::vector<uint8_t> out(std::max<size_t>(bytes.size() * 4, 1 << 16));
  size_t in_pos = 0, produced = 0;
  for (;;) {
    if (produced == out.size()) {
      EMBER_CHECK(out.size() < kMaxOutput, op, "'", path, "' inflates to more than ", kMaxOutput,
                  " bytes");
      out.resize(out.size() * 2);
    }
    const size_t in_chunk = std::min(bytes.size() - in_pos, kMaxChunk);
    const size_t out_chunk = std::min(out.size() - produced, kMaxChunk);
    zs.next_in = bytes.data() + in_pos;
    zs.avail_in = static_cast<uInt>(in_chunk);
    zs.next_out = out.data() + produced;
    zs.avail_out = static_cast<uInt>(out_chunk);
    const int status = inflate(&zs, Z_NO_FLUSH);
    const size_t consumed = in_chunk - zs.avail_in, written = out_chunk - zs.avail_out;
    in_pos += consumed;
    produced += written;
    if (status == Z_STREAM_END) {
      if (in_pos == bytes.size()) break;
      // Concatenated gzip members decompress to the concatenation of their contents.
      const bool another_member =
          bytes.size() - in_pos >= 2 && bytes[in_pos] == 0x1f && bytes[in_pos + 1] == 0x8b;
      EMBER_CHECK(another_member, op, "'", path, "' has ", bytes.size() - in_pos,
                  " trailing bytes after its gzip stream");
      inflateReset(&zs);
      continue;
    }
    EMBER_CHECK(status == Z_OK || status == Z_BUF_ERROR, op, "'", path,
                "' is not valid gzip data (zlib: ", zs.msg ? zs.msg : zError(status), ")");
    EMBER_CHECK(in_pos < bytes.size() || zs.avail_out == 0, op, "'", path,
                "' is truncated: its gzip stream ends after ", bytes.size(),
                " bytes, before the end of the compressed data");
    EMBER_CHECK(consumed > 0 || written > 0 || zs.avail_out == 0, op, "'", path,
                "' is not valid gzip data (inflate made no progress at byte ", in_pos, ")");
  }
  out.resize(produced);
  return out;
}

}  // namespace ember::data::detail
