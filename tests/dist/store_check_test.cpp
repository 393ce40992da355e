// The side-channel fingerprint check (detail/store_check.h) over a real TcpStore on loopback,
// with threads standing in for the ranks of 2 and 3.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ember/config.h>
#include <ember/dist/detail/store_check.h>
#include <ember/dist/tcp_store.h>
#include <ember/tensor/ops.h>

#if EMBER_WITH_CUDA
#include <ember/dist/nccl_process_group.h>
#include <ember/tensor/cuda.h>

#include "test_util.h"
#endif

namespace ember::dist {
namespace {

using namespace std::chrono_literals;
using detail::Fingerprint;
using detail::OpKind;
using detail::StoreFingerprintCheck;
using Clock = std::chrono::steady_clock;

Fingerprint allreduce(int64_t seq, int64_t numel = 4) {
  const Tensor t = zeros({numel});
  return Fingerprint::of(OpKind::kAllreduce, seq, &t, -1, static_cast<int>(ReduceOp::kSum));
}

Fingerprint barrier(int64_t seq) { return Fingerprint::of(OpKind::kBarrier, seq, nullptr, -1, -1); }

// `size` ranks' checks on one store (rank 0's thread serves it), each with its own client.
class Ranks {
 public:
  Ranks(int size, std::chrono::milliseconds timeout)
      : server_("127.0.0.1", 0, size, /*is_server=*/true, 10s), failures_(size) {
    for (int r = 0; r < size; ++r) {
      stores_.push_back(
          std::make_shared<TcpStore>("127.0.0.1", server_.port(), size, /*is_server=*/false, 10s));
      checks_.push_back(std::make_unique<StoreFingerprintCheck>(
          stores_.back(), "test/group", r, size, timeout, [this, r](const std::string& message) {
            std::lock_guard<std::mutex> lock(mutex_);
            failures_[static_cast<size_t>(r)] = message;
            ++failed_;
          }));
    }
  }
  StoreFingerprintCheck& operator[](int rank) { return *checks_[static_cast<size_t>(rank)]; }
  std::string failure(int rank) {
    std::lock_guard<std::mutex> lock(mutex_);
    return failures_[static_cast<size_t>(rank)];
  }
  // Until `count` ranks failed or 20 s passed.
  bool wait_failed(int count) {
    const auto deadline = Clock::now() + 20s;
    while (failed_.load() < count && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
    return failed_.load() >= count;
  }

 private:
  TcpStore server_;
  std::vector<std::shared_ptr<TcpStore>> stores_;
  std::mutex mutex_;
  std::vector<std::string> failures_;
  std::atomic<int> failed_{0};
  std::vector<std::unique_ptr<StoreFingerprintCheck>> checks_;  // stopped first
};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class StoreCheck : public ::testing::TestWithParam<int> {};

TEST_P(StoreCheck, MatchingCollectivesPassAndReuseTheirKeys) {
  const int size = GetParam();
  Ranks ranks(size, 10s);
  // Blocks of 64 in two slots per rank: 300 collectives overwrite each slot twice. Each rank
  // issues at its own pace, so they publish in batches of different bounds.
  constexpr int64_t kCollectives = 300;
  std::vector<std::thread> issuers;
  for (int r = 0; r < size; ++r) {
    issuers.emplace_back([&ranks, r] {
      for (int64_t seq = 1; seq <= kCollectives; ++seq) {
        ranks[r].post(seq % 3 == 0 ? barrier(seq) : allreduce(seq));
        if (seq % (5 + 6 * r) == 0) std::this_thread::sleep_for(200us);
      }
    });
  }
  for (std::thread& t : issuers) t.join();
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(ranks[r].wait_checked(20s)) << ranks.failure(r);
    EXPECT_EQ(ranks[r].checked(), kCollectives);
    EXPECT_EQ(ranks.failure(r), "");
  }
}

TEST_P(StoreCheck, AnotherOpIsNamedOnEveryRank) {
  const int size = GetParam();
  Ranks ranks(size, 10s);
  const int odd = size - 1;
  for (int r = 0; r < size; ++r) {
    ranks[r].post(allreduce(1));
    ranks[r].post(r == odd ? barrier(2) : allreduce(2));
  }
  ASSERT_TRUE(ranks.wait_failed(size));
  const std::string others =
      size == 2 ? "rank 0 issued allreduce #2" : "ranks 0, 1 issued allreduce #2";
  for (int r = 0; r < size; ++r) {
    const std::string message = ranks.failure(r);
    // Each rank names its own call first.
    const std::string own = r == odd ? "barrier #2" : "allreduce #2";
    EXPECT_TRUE(message.starts_with(own + " on rank " + std::to_string(r) + ": ")) << message;
    EXPECT_TRUE(contains(message, others)) << message;
    EXPECT_TRUE(contains(message, "rank " + std::to_string(odd) + " issued barrier #2")) << message;
    EXPECT_TRUE(contains(message, "the group cannot be used any more")) << message;
    EXPECT_EQ(ranks[r].checked(), 1);
  }
}

TEST_P(StoreCheck, AnotherCountIsNamedOnEveryRank) {
  const int size = GetParam();
  Ranks ranks(size, 10s);
  for (int r = 0; r < size; ++r) ranks[r].post(allreduce(1, r == 0 ? 6 : 4));
  ASSERT_TRUE(ranks.wait_failed(size));
  for (int r = 0; r < size; ++r) {
    const std::string message = ranks.failure(r);
    EXPECT_TRUE(contains(message, "rank 0 issued allreduce #1 on f32 [6] (sum)")) << message;
    EXPECT_TRUE(contains(message, "issued allreduce #1 on f32 [4] (sum)")) << message;
  }
}

TEST_P(StoreCheck, ARankThatLeavesIsNamedAtOnceByOneThatWaits) {
  // The guarded save on the last epoch: rank 0 goes into its barrier, the others leave.
  const int size = GetParam();
  Ranks ranks(size, 60s);
  for (int r = 0; r < size; ++r) ranks[r].post(allreduce(1));
  for (int r = 1; r < size; ++r) {
    ASSERT_TRUE(ranks[r].wait_checked(20s));
    ranks[r].leave(Fingerprint::goodbye(1, static_cast<int32_t>(OpKind::kAllreduce)));
  }
  const auto start = Clock::now();
  ranks[0].post(barrier(2));
  ASSERT_TRUE(ranks.wait_failed(1));
  EXPECT_LT(Clock::now() - start, 5s);  // not the 60 s timeout
  const std::string message = ranks.failure(0);
  EXPECT_TRUE(contains(message, "barrier #2 on rank 0: rank")) << message;
  EXPECT_TRUE(contains(message, " left the group after allreduce #1")) << message;
  EXPECT_TRUE(contains(message, "rank 0 waited in barrier #2")) << message;
  EXPECT_EQ(ranks[0].checked(), 1);
}

TEST(StoreCheck, ARankThatLeftAfterIssuingACollectiveIsNamedOnlyAfterIt) {
  // Rank 1 issued #2 (NCCL has it) but left before its check published it: #2 is not
  // judged, #3 names the goodbye.
  Ranks ranks(2, 60s);
  ranks[0].post(allreduce(1));
  ranks[1].post(allreduce(1));
  ASSERT_TRUE(ranks[1].wait_checked(20s));
  ranks[1].leave(Fingerprint::goodbye(2, static_cast<int32_t>(OpKind::kAllreduce)));
  ranks[0].post(allreduce(2));
  EXPECT_TRUE(ranks[0].wait_checked(20s)) << ranks.failure(0);
  EXPECT_EQ(ranks[0].checked(), 2);
  ranks[0].post(allreduce(3));
  ASSERT_TRUE(ranks.wait_failed(1));
  const std::string message = ranks.failure(0);
  EXPECT_TRUE(contains(message, "rank 1 left the group after allreduce #2")) << message;
  EXPECT_TRUE(contains(message, "rank 0 waited in allreduce #3 on f32 [4] (sum)")) << message;
}

TEST_P(StoreCheck, ARankThatNeverArrivesIsNamedAtTheTimeout) {
  const int size = GetParam();
  Ranks ranks(size, 300ms);
  const int late = size - 1;
  for (int r = 0; r < size; ++r) {
    ranks[r].post(allreduce(1));
    if (r != late) ranks[r].post(allreduce(2));
  }
  ASSERT_TRUE(ranks.wait_failed(size - 1));
  for (int r = 0; r < size; ++r) {
    if (r == late) continue;
    const std::string message = ranks.failure(r);
    EXPECT_TRUE(contains(message, "allreduce #2 on rank " + std::to_string(r) + ": rank " +
                                      std::to_string(late) +
                                      " issued no collective #2 within 300 ms (its last was #1)"))
        << message;
  }
  EXPECT_TRUE(ranks[late].wait_checked(1s));
  EXPECT_EQ(ranks.failure(late), "");
}

INSTANTIATE_TEST_SUITE_P(Ranks, StoreCheck, ::testing::Values(2, 3));

TEST(StoreCheck, AWorldOfOneChecksAlone) {
  TcpStore server("127.0.0.1", 0, 1, true, 10s);
  auto client = std::make_shared<TcpStore>("127.0.0.1", server.port(), 1, false, 10s);
  StoreFingerprintCheck check(client, "solo", 0, 1, 1s, [](const std::string&) { FAIL(); });
  for (int64_t seq = 1; seq <= 3; ++seq) check.post(allreduce(seq));
  EXPECT_TRUE(check.wait_checked(10s));
  EXPECT_EQ(check.checked(), 3);
  EXPECT_THROW(StoreFingerprintCheck(client, "bad", 1, 1, 1s, nullptr), Error);
}

#if EMBER_WITH_CUDA
TEST(StoreCheck, NcclPublishesEachCollectiveAndItsGoodbye) {
  EMBER_REQUIRE_CUDA();
  TcpStore server("127.0.0.1", 0, 1, true, 10s);
  auto client = std::make_shared<TcpStore>("127.0.0.1", server.port(), 1, false, 10s);
  {
    NcclProcessGroup pg(0, 1, 0, 0, NcclProcessGroup::create_unique_id(), {},
                        {client, "nccl/check"});
    Tensor t = ones({256}, cuda_device(0));
    pg.allreduce(t)->wait(30s);
    pg.barrier()->wait();
    // Published beside the launches: the count catches up within moments.
    const auto deadline = Clock::now() + 10s;
    while (client->add("nccl/check/n/0", 0) < 2 && Clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
    EXPECT_EQ(client->add("nccl/check/n/0", 0), 2);
    // Block 0's slot holds both fingerprints, in order.
    const Fingerprint expected[2] = {allreduce(1, 256), barrier(2)};
    EXPECT_EQ(client->get("nccl/check/fp/0/0"),
              std::string(reinterpret_cast<const char*>(expected), sizeof(expected)));
    ::ember::testing::expect_close(t.cpu(), ones({256}));
  }
  EXPECT_EQ(client->add("nccl/check/n/0", 0), StoreFingerprintCheck::kLeft + 2);
  Fingerprint bye;
  const std::string bytes = client->get("nccl/check/bye/0");
  ASSERT_EQ(bytes.size(), sizeof(Fingerprint));
  std::memcpy(&bye, bytes.data(), sizeof(Fingerprint));
  EXPECT_EQ(bye.str(), "left the group after barrier #2");
}
#endif

}  // namespace
}  // namespace ember::dist
