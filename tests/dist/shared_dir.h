// A folder every rank of a test agrees on (named after rank 0's pid), created at once and
// removed by rank 0 once every rank is done with it.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include <ember/dist/process_group.h>

namespace ember::dist::testing {

class SharedDir {
 public:
  SharedDir(ProcessGroup& pg, const std::string& prefix) : pg_(pg) {
    Tensor pid = from_vector<int64_t>({static_cast<int64_t>(::getpid())}, {1});
    pg.broadcast(pid, 0)->wait();
    path_ = std::filesystem::path(::testing::TempDir()) /
            (prefix + std::to_string(pid.item<int64_t>()));
    std::filesystem::create_directories(path_);
  }
  SharedDir(const SharedDir&) = delete;
  SharedDir& operator=(const SharedDir&) = delete;
  ~SharedDir() {
    pg_.barrier()->wait();
    if (pg_.rank() == 0) std::filesystem::remove_all(path_);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  ProcessGroup& pg_;
  std::filesystem::path path_;
};

}  // namespace ember::dist::testing
