// The store of an mpirun job (detail::mpi_job_store): the one function that gives the MPI
// backend and NCCL under mpirun their store, and over which NCCL's groups compare their
// collectives and say goodbye (StoreFingerprintCheck). Here on the CPU at 2 and 3 ranks, the
// check driven as NCCL drives it: a planted mismatch and a rank that leaves while another waits
// are named within seconds. Under a single process, or a launch that is not mpirun, they skip.
// With a GPU, NCCL under mpirun at world size 1 publishes each collective and its goodbye there.
#include <gtest/gtest.h>
#include <mpi.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <ember/config.h>
#include <ember/dist/detail/auth.h>
#include <ember/dist/detail/mpi_runtime.h>
#include <ember/dist/detail/store_check.h>
#include <ember/dist/tcp_store.h>
#include <ember/tensor/ops.h>

#include "dist_test_util.h"

#if EMBER_WITH_CUDA
#include <ember/dist/init.h>
#include <ember/tensor/cuda.h>
#endif

namespace ember::dist {
namespace {

using namespace std::chrono_literals;
using detail::Fingerprint;
using detail::OpKind;
using detail::StoreFingerprintCheck;
using Clock = std::chrono::steady_clock;

bool under_mpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }

int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

Fingerprint allreduce(int64_t seq) {
  const Tensor t = zeros({4});
  return Fingerprint::of(OpKind::kAllreduce, seq, &t, -1, static_cast<int>(ReduceOp::kSum));
}

Fingerprint barrier(int64_t seq) { return Fingerprint::of(OpKind::kBarrier, seq, nullptr, -1, -1); }

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// This rank's check over the job's store, as NCCL's group makes it (its own prefix: the n-th
// check of every rank), and the failure it reports.
class JobCheck {
 public:
  explicit JobCheck(std::chrono::milliseconds timeout) {
    store_ = detail::mpi_job_store(MPI_COMM_WORLD, {}, 60s);
    EMBER_CHECK(store_ != nullptr, "JobCheck", "no store for the job");
    const int rank = world_rank();
    const int64_t n = store_->add("test/mpi_job/checks/" + std::to_string(rank), 1);
    check_ = std::make_unique<StoreFingerprintCheck>(store_, "test/mpi_job/" + std::to_string(n),
                                                     rank, world_size(), timeout,
                                                     [this](const std::string& message) {
                                                       std::lock_guard<std::mutex> lock(mutex_);
                                                       failure_ = message;
                                                       failed_.store(true);
                                                     });
  }
  StoreFingerprintCheck& operator*() { return *check_; }
  StoreFingerprintCheck* operator->() { return check_.get(); }
  // The failure, once reported (within 20 s), else "".
  std::string wait_failure() {
    const auto deadline = Clock::now() + 20s;
    while (!failed_.load() && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
    std::lock_guard<std::mutex> lock(mutex_);
    return failure_;
  }

 private:
  std::shared_ptr<TcpStore> store_;
  std::mutex mutex_;
  std::string failure_;
  std::atomic<bool> failed_{false};
  std::unique_ptr<StoreFingerprintCheck> check_;  // stopped first
};

class MpiJobStore : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::test_backend() != "mpi" || !under_mpirun()) GTEST_SKIP() << "an mpirun job";
    detail::ensure_mpi_initialized();
    if (world_size() < 2) GTEST_SKIP() << "2 ranks or more";
  }
  void TearDown() override {
    if (!IsSkipped()) MPI_Barrier(MPI_COMM_WORLD);  // in step for the next test
  }
};

TEST_F(MpiJobStore, CarriesRankZerosBytesAndOneStoreToEveryRank) {
  // NCCL's unique id travels in the broadcast that carries the store's address.
  std::array<char, 128> id{};
  if (world_rank() == 0) {
    for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(i * 7 + 1);
  }
  auto store = detail::mpi_job_store(MPI_COMM_WORLD, id, 60s);
  ASSERT_NE(store, nullptr);
  for (size_t i = 0; i < id.size(); ++i) ASSERT_EQ(id[i], static_cast<char>(i * 7 + 1)) << i;
  // One store per process, heard again by a later call (the MPI backend's next group).
  EXPECT_EQ(detail::mpi_job_store(MPI_COMM_WORLD, {}, 60s).get(), store.get());
  // Every rank reaches the same one: each counts itself in, and each sees all.
  const int64_t round = store->add("test/mpi_job/round/" + std::to_string(world_rank()), 1);
  const std::string key = "test/mpi_job/arrived/" + std::to_string(round);
  store->add(key, 1);
  const auto deadline = Clock::now() + 20s;
  while (store->add(key, 0) < world_size() && Clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(store->add(key, 0), world_size());
  // Without a job secret in the environment rank 0 drew one: a process that lacks it is refused.
  if (detail::job_secret().empty()) {
    auto stranger = [&] {
      TcpStore s("127.0.0.1", store->port(), world_size(), false, 5s,
                 TcpStoreOptions{.secret = std::string()});
      s.add("test/mpi_job/stranger", 1);
    };
    EXPECT_THROW(stranger(), Error);
    EXPECT_EQ(store->add("test/mpi_job/stranger", 0), 0);
  }
}

TEST_F(MpiJobStore, ACheckOverItNamesAnotherOpOnEveryRankWithinSeconds) {
  const int rank = world_rank(), size = world_size(), odd = size - 1;
  JobCheck check(60s);  // a failure that waited for the timeout shows
  const auto start = Clock::now();
  check->post(allreduce(1));
  check->post(rank == odd ? barrier(2) : allreduce(2));
  const std::string message = check.wait_failure();
  EXPECT_LT(Clock::now() - start, 5s);
  const std::string own = rank == odd ? "barrier #2" : "allreduce #2";
  EXPECT_TRUE(message.starts_with(own + " on rank " + std::to_string(rank) + ": ")) << message;
  const std::string others =
      size == 2 ? "rank 0 issued allreduce #2" : "ranks 0, 1 issued allreduce #2";
  EXPECT_TRUE(contains(message, others)) << message;
  EXPECT_TRUE(contains(message, "rank " + std::to_string(odd) + " issued barrier #2")) << message;
  EXPECT_EQ(check->checked(), 1);
}

TEST_F(MpiJobStore, ACheckOverItNamesRanksThatLeftWhileRankZeroWaitsWithinSeconds) {
  // The DDP tutorial's last epoch: rank 0 saves (a barrier) while the others have left.
  const int rank = world_rank();
  JobCheck check(60s);
  check->post(allreduce(1));
  if (rank != 0) {
    ASSERT_TRUE(check->wait_checked(20s));
    check->leave(Fingerprint::goodbye(1, static_cast<int32_t>(OpKind::kAllreduce)));
    return;
  }
  const auto start = Clock::now();
  check->post(barrier(2));
  const std::string message = check.wait_failure();
  EXPECT_LT(Clock::now() - start, 5s);  // not the 60 s timeout
  EXPECT_TRUE(contains(message, "barrier #2 on rank 0: rank")) << message;
  EXPECT_TRUE(contains(message, " left the group after allreduce #1")) << message;
  EXPECT_TRUE(contains(message, "rank 0 waited in barrier #2")) << message;
  EXPECT_EQ(check->checked(), 1);
}

#if EMBER_WITH_CUDA
// NCCL under mpirun (the GPU session runs the dist suite under mpirun at one rank): the group
// gets its side channel from the job's store, publishes each collective there and, when it
// goes, its goodbye.
TEST(MpiJobStoreNccl, NcclUnderMpirunComparesAndSaysGoodbyeOverTheJobStore) {
  EMBER_REQUIRE_CUDA();
  if (!under_mpirun()) GTEST_SKIP() << "an mpirun job";
  detail::ensure_mpi_initialized();
  if (world_size() != 1) GTEST_SKIP() << "NCCL at world size 1 (one GPU)";
  InitOptions options;
  options.backend = "nccl";
  auto pg = init_process_group(options);
  auto store = detail::mpi_job_store(MPI_COMM_WORLD, {}, 60s);
  ASSERT_NE(store, nullptr);
  const int64_t group = store->add("ember/nccl/groups/0", 0);  // the group just made
  const std::string count = "ember/nccl/" + std::to_string(group) + "/check/n/0";
  Tensor t = ones({256}, cuda_device(0));
  pg->allreduce(t)->wait(30s);
  pg->barrier()->wait();
  const auto deadline = Clock::now() + 10s;
  while (store->add(count, 0) < 2 && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(store->add(count, 0), 2);
  pg.reset();
  destroy_process_group();
  EXPECT_EQ(store->add(count, 0), StoreFingerprintCheck::kLeft + 2);
  ::ember::testing::expect_close(t.cpu(), ones({256}));
}
#endif

}  // namespace
}  // namespace ember::dist
