// The dist suite's main: under mpirun it initialises MPI (MPI_THREAD_MULTIPLE) for every test
// and finalises it at the end; started torchrun-style (RANK set) it leaves MPI alone, and under
// srun ember initialises MPI when a test first needs it. Rank 0 prints gtest's usual output;
// the other ranks print only their failures, prefixed with their rank. Each rank's exit status
// is its own result. Each test starts from manual_seed(0) (seed_each_test.h).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <ember/dist/init.h>

#include "seed_each_test.h"

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // The test's name is kept here: gtest reports a failure while it holds the lock that
  // UnitTest::current_test_info() takes, so asking for it there would deadlock.
  void OnTestStart(const ::testing::TestInfo& test) override {
    test_ = std::string(test.test_suite_name()) + "." + test.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] FAILED %s at %s:%d\n%s\n", rank_, test_.c_str(),
                 result.file_name() != nullptr ? result.file_name() : "?", result.line_number(),
                 result.message());
  }

 private:
  int rank_;
  std::string test_ = "?";
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const bool under_mpirun = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
  int rank = 0;
  if (under_mpirun) {
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
      std::fprintf(stderr, "MPI_Init_thread failed\n");
      return 2;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  } else if (const char* torchrun_rank = std::getenv("RANK")) {
    rank = std::atoi(torchrun_rank);
  } else if (const char* slurm_rank = std::getenv("SLURM_PROCID")) {
    rank = std::atoi(slurm_rank);  // srun: MPI starts with the first group a test makes
  }
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  ember::testing::seed_each_test();  // every test starts from manual_seed(0)
  const int result = RUN_ALL_TESTS();
  // A test that left the default group behind: it goes before MPI does.
  if (ember::dist::is_initialized()) ember::dist::destroy_process_group();
  if (under_mpirun) MPI_Finalize();
  return result;
}
