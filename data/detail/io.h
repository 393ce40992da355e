// File reading shared by the dataset parsers (private).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace ember::data::detail {

// std::filesystem::exists, but false (not an exception) when the status cannot be read.
bool exists_no_throw(const std::filesystem::path& path);
// The whole file; ember::Error naming `op` and `path` when it cannot be opened or read.
std::vector<uint8_t> read_file(const std::string& path, const char* op);
// `bytes` decompressed when they start with gzip's magic (1f 8b), else unchanged.
// Truncated or corrupt streams give an ember::Error naming `op` and `path`.
std::vector<uint8_t> maybe_gunzip(std::vector<uint8_t> bytes, const std::string& path,
                                  const char* op);

}  // namespace ember::data::detail
