// Helpers for the DDP, SyncBatchNorm, sampler and checkpoint tests: the world group (MPI
// under mpirun, a world of one otherwise) and small deterministic models and data.
#pragma once

#include <chrono>
#include <memory>

#include <ember/dist/mpi_process_group.h>

#include "test_util.h"

namespace ember::dist::testing {

// A fresh group over all ranks; a broken test fails after a minute instead of hanging.
inline std::shared_ptr<ProcessGroup> world() {
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(60);
  return std::make_shared<MpiProcessGroup>(options);
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

}  // namespace ember::dist::testing
