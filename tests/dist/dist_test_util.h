// Helpers for the dist tests: the group under test and small deterministic models and data.
// The backend is EMBER_TEST_BACKEND: "mpi" (the default: the world mpirun made, or a world of
// one) or "tcp" (ranks started torchrun-style by torchrun_style.sh, met through the TcpStore
// at MASTER_ADDR:MASTER_PORT).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>

#include <ember/dist/init.h>
#include <ember/dist/mpi_process_group.h>
#include <ember/dist/tcp_process_group.h>

#include "test_util.h"

namespace ember::dist::testing {

inline std::string test_backend() {
  const char* backend = std::getenv("EMBER_TEST_BACKEND");
  return backend != nullptr && backend[0] != '\0' ? backend : "mpi";
}

// A fresh group over all ranks on the backend under test. Made directly, not by
// init_process_group: tests make many groups, and only one can be the default group.
inline std::shared_ptr<ProcessGroup> make_group(const ProcessGroupOptions& options) {
  const std::string backend = test_backend();
  if (backend == "mpi") return std::make_shared<MpiProcessGroup>(options);
  EMBER_CHECK(backend == "tcp", "make_group", "EMBER_TEST_BACKEND=", backend,
              " is not a backend of the dist tests (mpi or tcp)");
  const LaunchEnv launch = read_launch_env();
  return std::make_shared<TcpProcessGroup>(launch.master_addr, launch.master_port, launch.rank,
                                           launch.world_size, launch.local_rank, options);
}

// A loopback port nothing listens on right now.
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t length = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// init_process_group's options for the tests: on the CPU (a visible GPU would pick NCCL),
// failing after `timeout` instead of hanging.
inline InitOptions cpu_init(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  InitOptions init;
  init.device = kCPU;
  init.group.timeout = timeout;
  return init;
}

// Destroys the default group, if any, when the scope ends: tests that call
// init_process_group() leave none behind for the next test, even when they fail.
struct DefaultGroupGuard {
  DefaultGroupGuard() = default;
  DefaultGroupGuard(const DefaultGroupGuard&) = delete;
  DefaultGroupGuard& operator=(const DefaultGroupGuard&) = delete;
  ~DefaultGroupGuard() {
    if (is_initialized()) destroy_process_group();
  }
};

// The same; a broken test fails after a minute instead of hanging.
inline std::shared_ptr<ProcessGroup> world() {
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(60);
  return make_group(options);
}

// Rows [rank * n / world, (rank + 1) * n / world) of t: this rank's share of a global batch.
inline Tensor shard_rows(const Tensor& t, const ProcessGroup& pg) {
  const int64_t n = t.size(0);
  const int64_t begin = n * pg.rank() / pg.size(), end = n * (pg.rank() + 1) / pg.size();
  return t.narrow(0, begin, end - begin);
}

// Every parameter and buffer of `actual` against `expected`, by name.
inline void expect_same_state(nn::Module& actual, nn::Module& expected, double rtol, double atol) {
  const auto a = actual.state_dict();
  const auto e = expected.state_dict();
  ASSERT_EQ(a.size(), e.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].first);
    ASSERT_EQ(a[i].first, e[i].first);
    ::ember::testing::expect_close(a[i].second.detach(), e[i].second.detach(), rtol, atol);
  }
}

// Forwards to another group and counts the collectives, to check who communicates when.
class CountingGroup : public ProcessGroup {
 public:
  explicit CountingGroup(std::shared_ptr<ProcessGroup> inner)
      : ProcessGroup(inner->rank(), inner->size(), inner->local_rank()), inner_(std::move(inner)) {}
  std::string backend() const override { return inner_->backend(); }
  WorkHandle allreduce(const Tensor& t, ReduceOp op) override {
    ++calls;
    return inner_->allreduce(t, op);
  }
  WorkHandle broadcast(const Tensor& t, int root) override {
    ++calls;
    return inner_->broadcast(t, root);
  }
  WorkHandle allgather(const std::vector<Tensor>& outputs, const Tensor& input) override {
    ++calls;
    return inner_->allgather(outputs, input);
  }
  WorkHandle reduce(const Tensor& t, int root, ReduceOp op) override {
    ++calls;
    return inner_->reduce(t, root, op);
  }
  WorkHandle reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                            ReduceOp op) override {
    ++calls;
    return inner_->reduce_scatter(output, inputs, op);
  }
  WorkHandle barrier() override {
    ++calls;
    return inner_->barrier();
  }
  WorkHandle send(const Tensor& t, int dst, int tag) override { return inner_->send(t, dst, tag); }
  WorkHandle recv(const Tensor& t, int src, int tag) override { return inner_->recv(t, src, tag); }
  int calls = 0;

 private:
  std::shared_ptr<ProcessGroup> inner_;
};

}  // namespace ember::dist::testing
