// The MPI backend runs an all-reduce inline on the waiter's thread (waited on at once) or on
// the communication thread (issued, then waited on later), and with or without a receive in
// flight; ranks that differ in that must still meet in the same MPI call and agree. All-reduces
// over 16 MiB go to MPI in pieces that must cover every element exactly once.
#include <functional>
#include <random>
#include <thread>

#include <ember/dist/mpi_process_group.h>
#include <ember/tensor/ops.h>

#include "dist_test_util.h"

namespace ember::dist {
namespace {

using namespace std::chrono_literals;

// Twice 16 MiB of f32 and a ragged tail: two full pieces and a short last one.
constexpr int64_t kLarge = (int64_t{16} << 20) / 4 * 2 + 12345;

// `scale` * (i % 7) at index i: small integers, exact in f32.
Tensor pattern(double scale, int64_t n) {
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    values[static_cast<size_t>(i)] = static_cast<float>(scale * (i % 7));
  return from_vector(values, {n});
}

// What rank r holds, and the sum of that over ranks.
Tensor rank_pattern(int rank, int64_t n) { return pattern(rank + 1, n); }
Tensor pattern_sum(int size, int64_t n) { return pattern(size * (size + 1) / 2.0, n); }

void expect_equal(const Tensor& actual, const Tensor& expected) {
  ASSERT_EQ(actual.sizes(), expected.sizes());
  EXPECT_EQ(actual.sub(expected).abs().max().item<double>(), 0.0);
}

std::shared_ptr<MpiProcessGroup> mpi_world() {
  ProcessGroupOptions options;
  options.timeout = 60s;
  return std::make_shared<MpiProcessGroup>(options);
}

class MpiPaths : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::test_backend() != "mpi") GTEST_SKIP() << "MPI backend paths";
  }
};

TEST_F(MpiPaths, LargeAllreduceWaitedAtOnceGoesInPieces) {
  auto pg = mpi_world();
  Tensor t = rank_pattern(pg->rank(), kLarge);
  pg->allreduce(t)->wait();
  expect_equal(t, pattern_sum(pg->size(), kLarge));
}

TEST_F(MpiPaths, LargeAllreduceOnTheCommunicationThread) {
  auto pg = mpi_world();
  Tensor a = rank_pattern(pg->rank(), kLarge);
  Tensor b = rank_pattern(pg->rank(), kLarge / 3);
  // Two in the queue: neither is run inline by a waiter that comes later.
  WorkHandle first = pg->allreduce(a);
  WorkHandle second = pg->allreduce(b, ReduceOp::kAvg);
  std::this_thread::sleep_for(5ms);
  second->wait();
  EXPECT_TRUE(first->is_completed());
  first->wait();
  expect_equal(a, pattern_sum(pg->size(), kLarge));
  expect_equal(b, pattern((pg->size() + 1) / 2.0, kLarge / 3));  // the mean of 1..size
}

TEST_F(MpiPaths, LargeAllreduceWhileSomeRanksHaveAReceiveInFlight) {
  auto pg = mpi_world();
  if (pg->size() < 2) GTEST_SKIP() << "needs a peer";
  const int peer = pg->rank() ^ 1;
  if (peer >= pg->size()) {  // the odd rank out of 3 has nothing in flight
    Tensor t = rank_pattern(pg->rank(), kLarge);
    pg->allreduce(t)->wait();
    expect_equal(t, pattern_sum(pg->size(), kLarge));
    return;
  }
  Tensor incoming = zeros({4});
  WorkHandle receive = pg->recv(incoming, peer, 7);
  Tensor t = rank_pattern(pg->rank(), kLarge);
  WorkHandle reduce = pg->allreduce(t);
  reduce->wait();
  expect_equal(t, pattern_sum(pg->size(), kLarge));
  pg->send(full({4}, pg->rank() + 10.0), peer, 7)->wait();
  receive->wait();
  expect_equal(incoming, full({4}, peer + 10.0));
}

TEST_F(MpiPaths, ReceiveCompletesWhileALaterAllreduceBlocks) {
  // Rank 0 waits for a receive issued before an all-reduce that rank 1 joins only after a
  // barrier on another group, which rank 0 reaches only once the receive completed: the
  // receive's completion must be seen while the all-reduce blocks the collective thread.
  auto pg = mpi_world();
  auto other = mpi_world();
  if (pg->size() < 2) GTEST_SKIP() << "needs a peer";
  Tensor message = zeros({16});
  Tensor summed = full({1024}, 1.0);
  if (pg->rank() == 0) {
    WorkHandle receive = pg->recv(message, 1, 3);
    WorkHandle reduce = pg->allreduce(summed);
    std::this_thread::sleep_for(5ms);  // the collective thread has entered the all-reduce
    receive->wait();
    other->barrier()->wait();
    reduce->wait();
    expect_equal(message, full({16}, 7.0));
  } else {
    std::this_thread::sleep_for(200ms);
    if (pg->rank() == 1) pg->send(full({16}, 7.0), 0, 3)->wait();
    other->barrier()->wait();
    pg->allreduce(summed)->wait();
  }
  expect_equal(summed, full({1024}, static_cast<double>(pg->size())));
}

// A collective nobody waits on is started by the communication thread, whether that thread
// spins after the waited ones before it (their waiters ran them) or has gone to sleep.
TEST_F(MpiPaths, AnUnwaitedCollectiveAfterWaitedOnesStartsByItself) {
  auto pg = mpi_world();
  Tensor a = ones({256});
  Tensor b = full({256}, pg->rank() + 1);
  for (int round = 0; round < 200; ++round) {
    pg->allreduce(a, ReduceOp::kMax)->wait();
    if (round % 10 == 9) std::this_thread::sleep_for(round % 20 == 9 ? 100us : 2ms);
    WorkHandle later = pg->allreduce(b, ReduceOp::kMax);
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!later->is_completed() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    ASSERT_TRUE(later->is_completed()) << "round " << round << ": not started in 10 s";
    later->wait();
  }
  expect_equal(b, full({256}, pg->size()));
}

TEST_F(MpiPaths, ASecondWaiterWakesWhenTheFirstWaitersRunFinishes) {
  // Rank 0's first waiter runs the all-reduce itself (inline) and blocks in it until rank 1
  // joins, 300 ms late; a second waiter on the same Work sleeps meanwhile and must be woken
  // when that run finishes, not at the end of its 5 s limit.
  auto pg = mpi_world();
  if (pg->size() < 2) GTEST_SKIP() << "needs a peer";
  Tensor summed = full({256}, 1.0);
  if (pg->rank() == 0) {
    WorkHandle reduce = pg->allreduce(summed);
    std::thread first([&] { reduce->wait(); });
    std::this_thread::sleep_for(50ms);  // the first waiter has claimed it by now
    const auto start = std::chrono::steady_clock::now();
    reduce->wait(5s);
    const auto waited = std::chrono::steady_clock::now() - start;
    first.join();
    EXPECT_TRUE(reduce->is_completed());
    EXPECT_LT(waited, 3s) << "the second waiter slept until its limit";
  } else {
    std::this_thread::sleep_for(300ms);
    pg->allreduce(summed)->wait();
  }
  expect_equal(summed, full({256}, static_cast<double>(pg->size())));
}

TEST_F(MpiPaths, SendIssuedBehindAPendingAllreduceStartsOnceItFinishes) {
  // Rank 0's send waits for its all-reduce, which rank 1 joins late: the send/recv thread,
  // asleep meanwhile, must be woken when the all-reduce is counted finished.
  auto pg = mpi_world();
  if (pg->size() < 2) GTEST_SKIP() << "needs a peer";
  Tensor summed = full({256}, 1.0);
  Tensor message = zeros({8});
  if (pg->rank() == 0) {
    std::this_thread::sleep_for(20ms);  // the send/recv thread sleeps, nothing queued
    WorkHandle reduce = pg->allreduce(summed);
    WorkHandle send = pg->send(full({8}, 5.0), 1, 9);
    send->wait(10s);
    reduce->wait();
  } else {
    std::this_thread::sleep_for(100ms);
    pg->allreduce(summed)->wait();
    if (pg->rank() == 1) pg->recv(message, 0, 9)->wait(10s);
  }
  expect_equal(summed, full({256}, static_cast<double>(pg->size())));
  if (pg->rank() == 1) expect_equal(message, full({8}, 5.0));
}

TEST_F(MpiPaths, InlineAndThreadedAllreducesInterleave) {
  auto pg = mpi_world();
  for (int round = 0; round < 20; ++round) {
    Tensor waited = full({1000}, pg->rank() + round);
    Tensor later = full({3000}, 2.0 * pg->rank());
    WorkHandle pending = pg->allreduce(later, ReduceOp::kMax);
    if (round % 2 == 0) std::this_thread::sleep_for(1ms);  // let the thread take it
    pg->allreduce(waited)->wait();
    pending->wait();
    const double ranks_sum = pg->size() * (pg->size() - 1) / 2.0;
    expect_equal(waited, full({1000}, ranks_sum + pg->size() * round));
    expect_equal(later, full({3000}, 2.0 * (pg->size() - 1)));
  }
}

TEST_F(MpiPaths, RandomMixOfWaitedAndPendingOperationsAgrees) {
  // The same pseudo-random program on every rank (the same seed): all-reduces waited on at
  // once (inline) or later (the thread), broadcasts, barriers and ring sends/receives, waited
  // on in a shuffled order after rank-dependent pauses. Issue order is all that must match.
  auto pg = mpi_world();
  const int rank = pg->rank(), size = pg->size();
  std::mt19937 program(1234);
  std::mt19937 pauses(static_cast<unsigned>(99 + rank));
  struct Pending {
    WorkHandle work;
    std::function<void()> check;
  };
  std::vector<Pending> pending;
  auto settle = [&](size_t keep) {
    std::shuffle(pending.begin(), pending.end(), pauses);
    while (pending.size() > keep) {
      pending.back().work->wait();
      pending.back().check();
      pending.pop_back();
    }
  };
  for (int round = 0; round < 300; ++round) {
    const auto n = static_cast<int64_t>(1 + program() % 3000);
    const unsigned kind = program() % (size > 1 ? 5 : 4);
    const bool wait_now = program() % 2 == 0;
    if (pauses() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(pauses() % 300));
    Pending p;
    if (kind <= 1) {  // all-reduce, sum or max
      Tensor t = full({n}, rank + 1.0 + round);
      const bool sum = kind == 0;
      p.work = pg->allreduce(t, sum ? ReduceOp::kSum : ReduceOp::kMax);
      const double expected = sum ? size * (size + 1) / 2.0 + size * round : size + round;
      p.check = [t, n, expected] { expect_equal(t, full({n}, expected)); };
    } else if (kind == 2) {
      const int root = round % size;
      Tensor t = full({n}, rank == root ? round : -1.0);
      p.work = pg->broadcast(t, root);
      p.check = [t, n, round] { expect_equal(t, full({n}, static_cast<double>(round))); };
    } else if (kind == 3) {
      p.work = pg->barrier();
      p.check = [] {};
    } else {  // a ring: send to the next rank, receive from the previous one
      Tensor out = full({n}, 1000.0 * rank + round);
      Tensor in = zeros({n});
      const int from = (rank + size - 1) % size;
      WorkHandle send = pg->send(out, (rank + 1) % size, round);
      p.work = pg->recv(in, from, round);
      p.check = [send, in, n, from, round] {
        send->wait();
        expect_equal(in, full({n}, 1000.0 * from + round));
      };
    }
    if (wait_now) {
      p.work->wait();
      p.check();
    } else {
      pending.push_back(std::move(p));
    }
    if (pending.size() > 6 || program() % 10 == 0) settle(pending.size() / 2);
  }
  settle(0);
}

}  // namespace
}  // namespace ember::dist
