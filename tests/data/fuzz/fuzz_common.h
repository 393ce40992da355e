// Shared by the libFuzzer harnesses: the input as a file (a memfd, read through
// /proc/self/fd/N as the readers read any path), and seeding of an empty corpus folder with
// valid files so that fuzzing starts from the formats' real structure.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "../formats.h"

namespace ember::data::fuzz {

// The fuzz input as a regular file; the path lives as long as this object.
class InputFile {
 public:
  InputFile(const uint8_t* data, size_t size) {
    fd_ = ::memfd_create("ember_fuzz", MFD_CLOEXEC);
    if (fd_ < 0) std::abort();
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~InputFile() { ::close(fd_); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// Writes `seeds` into the first corpus folder named on the command line when it is empty.
inline void write_seeds(int argc, char** argv,
                        const std::vector<std::pair<std::string, testing::Bytes>>& seeds) {
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] == '-') continue;
    const std::filesystem::path dir(argv[i]);
    std::error_code error;
    if (!std::filesystem::is_directory(dir, error) || !std::filesystem::is_empty(dir, error)) {
      return;
    }
    for (const auto& [name, bytes] : seeds) {
      std::ofstream out(dir / name, std::ios::binary);
      out.write(reinterpret_cast<const char*>(bytes.data()),
                static_cast<std::streamsize>(bytes.size()));
    }
    return;
  }
}

}  // namespace ember::data::fuzz
