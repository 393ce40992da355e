// Process groups: every collective on the backend under test (MPI in whatever world mpirun
// made: 1, 2 or 3 ranks; TCP at 2 or 3 ranks started by torchrun_style.sh; see
// dist_test_util.h), on a TCP world of one, on the single-process backend and, where a GPU is
// visible, on an NCCL world of one and MPI with CUDA tensors, for every dtype, against values
// computed here; asynchrony, ordering, barrier, send/recv, debug mode, argument
// errors, and how the TCP backend reports ranks that disagree.
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <thread>

#include <ember/dist/detail/common.h>
#include <ember/dist/detail/shared_store.h>
#include <ember/dist/dist.h>

#include "dist_test_util.h"

namespace ember::dist {
namespace {

using ::ember::dist::testing::make_group;
using ::ember::dist::testing::test_backend;
using ::ember::testing::expect_close;
using namespace std::chrono_literals;

const std::vector<DType> kAllDTypes = {kF32, kF64, kF16, kBF16, kI64, kI32, kU8, kBool};
const std::vector<ReduceOp> kAllOps = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax,
                                       ReduceOp::kMin};

// The value rank r holds at index i: small integers, exact in every dtype, different per rank.
double value(int r, int64_t i, DType dtype) {
  if (dtype == kBool) return (i + r) % 3 == 0 ? 1 : 0;
  if (dtype == kU8) return (r + 1) * (i % 5) + r;
  return (r + 1) * (i % 5 - 2) + r;
}

Tensor rank_tensor(int r, const Shape& shape, DType dtype, int64_t offset = 0) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = value(r, i + offset, dtype);
  return from_vector(values, shape).to(dtype);
}

// The reduction over ranks 0..size-1 of rank_tensor, computed in double.
Tensor expected_reduction(int size, const Shape& shape, DType dtype, ReduceOp op,
                          int64_t offset = 0) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double acc = value(0, i + offset, dtype);
    for (int r = 1; r < size; ++r) {
      const double v = value(r, i + offset, dtype);
      if (op == ReduceOp::kMax || (op == ReduceOp::kSum && dtype == kBool)) {
        acc = std::max(acc, v);
      } else if (op == ReduceOp::kMin) {
        acc = std::min(acc, v);
      } else {
        acc += v;
      }
    }
    if (op == ReduceOp::kAvg) acc /= size;
    out[static_cast<size_t>(i)] = acc;
  }
  return from_vector(out, shape).to(dtype);
}

double rtol_for(DType dtype) { return dtype == kF16 || dtype == kBF16 ? 1e-2 : 1e-6; }

bool op_applies(DType dtype, ReduceOp op) { return op != ReduceOp::kAvg || is_floating(dtype); }

ProcessGroupOptions test_options(bool debug = false) {
  ProcessGroupOptions o;
  o.timeout = 60s;  // a broken test fails instead of hanging
  o.debug = debug;
  return o;
}

std::string label(DType dtype, ReduceOp op) {
  return std::string(dtype_name(dtype)) + " " + detail::reduce_op_name(op);
}

// The collective checks, run against any group, on tensors of `device`.
void check_allreduce(ProcessGroup& pg, const Shape& shape, Device device = kCPU) {
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : kAllOps) {
      if (!op_applies(dtype, op)) continue;
      SCOPED_TRACE(label(dtype, op));
      Tensor t = rank_tensor(pg.rank(), shape, dtype).to(device);
      pg.allreduce(t, op)->wait();
      expect_close(t.cpu(), expected_reduction(pg.size(), shape, dtype, op), rtol_for(dtype));
    }
  }
}

void check_broadcast(ProcessGroup& pg, Device device = kCPU) {
  for (DType dtype : kAllDTypes) {
    for (int root = 0; root < pg.size(); ++root) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " root " + std::to_string(root));
      Tensor t = rank_tensor(pg.rank(), {3, 7}, dtype).to(device);
      pg.broadcast(t, root)->wait();
      expect_close(t.cpu(), rank_tensor(root, {3, 7}, dtype));
    }
  }
}

void check_allgather(ProcessGroup& pg, Device device = kCPU) {
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor input = rank_tensor(pg.rank(), {2, 5}, dtype).to(device);
    // Separate output tensors, and views into one block (gathered in place).
    std::vector<Tensor> separate;
    Tensor block = zeros({pg.size(), 2, 5}, TensorOptions(dtype, device));
    std::vector<Tensor> views;
    for (int r = 0; r < pg.size(); ++r) {
      separate.push_back(zeros({2, 5}, TensorOptions(dtype, device)));
      views.push_back(block.select(0, r));
    }
    auto w1 = pg.allgather(separate, input);
    auto w2 = pg.allgather(views, input);
    w1->wait();
    w2->wait();
    for (int r = 0; r < pg.size(); ++r) {
      expect_close(separate[static_cast<size_t>(r)].cpu(), rank_tensor(r, {2, 5}, dtype));
      expect_close(block.select(0, r).cpu(), rank_tensor(r, {2, 5}, dtype));
    }
  }
}

void check_reduce(ProcessGroup& pg, Device device = kCPU) {
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : kAllOps) {
      if (!op_applies(dtype, op)) continue;
      const int root = pg.size() - 1;
      SCOPED_TRACE(label(dtype, op));
      Tensor t = rank_tensor(pg.rank(), {17}, dtype).to(device);
      pg.reduce(t, root, op)->wait();
      if (pg.rank() == root) {
        expect_close(t.cpu(), expected_reduction(pg.size(), {17}, dtype, op), rtol_for(dtype));
      }
    }
  }
}

void check_reduce_scatter(ProcessGroup& pg, Device device = kCPU) {
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : kAllOps) {
      if (!op_applies(dtype, op)) continue;
      SCOPED_TRACE(label(dtype, op));
      // inputs[j] on rank r holds rank_tensor(r) at offset 10 * j: rank j gets their reduction.
      std::vector<Tensor> inputs;
      for (int j = 0; j < pg.size(); ++j)
        inputs.push_back(rank_tensor(pg.rank(), {10}, dtype, 10 * j).to(device));
      Tensor output = zeros({10}, TensorOptions(dtype, device));
      pg.reduce_scatter(output, inputs, op)->wait();
      expect_close(output.cpu(), expected_reduction(pg.size(), {10}, dtype, op, 10 * pg.rank()),
                   rtol_for(dtype));
    }
  }
}

// --- the backend under test ---------------------------------------------------------------

TEST(WorldGroup, RankAndSize) {
  auto group = make_group(test_options());
  ProcessGroup& pg = *group;
  EXPECT_EQ(pg.backend(), test_backend());
  EXPECT_GE(pg.size(), 1);
  EXPECT_GE(pg.rank(), 0);
  EXPECT_LT(pg.rank(), pg.size());
  EXPECT_GE(pg.local_rank(), 0);
  EXPECT_EQ(pg.tensor_device(), kCPU);  // the CPU backends keep their own exchanges there
  if (const char* size = std::getenv("OMPI_COMM_WORLD_SIZE")) {
    EXPECT_EQ(pg.size(), std::atoi(size));
  }
  if (const char* size = std::getenv("WORLD_SIZE")) {
    EXPECT_EQ(pg.size(), std::atoi(size));
  }
}

TEST(WorldGroup, AllreduceEveryDtypeAndOp) {
  auto group = make_group(test_options());
  ProcessGroup& pg = *group;
  check_allreduce(pg, {4, 25});
}

TEST(WorldGroup, AllreduceLargeAndEmpty) {
  auto group = make_group(test_options());
  ProcessGroup& pg = *group;
  check_allreduce(pg, {0});
  Tensor big = rank_tensor(pg.rank(), {3 << 20}, kF32);  // 12 MiB: many fragments
  pg.allreduce(big, ReduceOp::kAvg)->wait();
  expect_close(big, expected_reduction(pg.size(), {3 << 20}, kF32, ReduceOp::kAvg));
}

TEST(WorldGroup, BroadcastEveryDtypeAndRoot) {
  auto group = make_group(test_options());
  ProcessGroup& pg = *group;
  check_broadcast(pg);
}

TEST(WorldGroup, AllgatherEveryDtype) {
  auto group = make_group(test_options());
  ProcessGroup& pg = *group;
  check_allgather(pg);
}

TEST(WorldGroup, ReduceEveryDtypeAndOp) {
  auto group = make_group(test_options());
  ProcessGroup& pg = *group;
  check_reduce(pg);
}

TEST(WorldGroup, ReduceScatterEveryDtypeAndOp) {
  auto group = make_group(test_options());
  ProcessGroup& pg = *group;
  check_reduce_scatter(pg);
}

TEST(WorldGroup, HalfAndBFloat16SumsAreExactWhereRepresentable) {
  // The 16-bit MPI_Ops add in float and round once per step: exact for these values.
  auto group = make_group(test_options());
  ProcessGroup& pg = *group;
  Tensor t = full({8}, 0.5 + pg.rank() * 0.25, kF16);
  pg.allreduce(t)->wait();
  double expected = 0;
  for (int r = 0; r < pg.size(); ++r) expected += 0.5 + r * 0.25;
  expect_close(t, full({8}, expected, kF16), 0, 0);
  Tensor b = full({8}, 0.5 + pg.rank() * 0.25, kBF16);
  pg.allreduce(b, ReduceOp::kMax)->wait();
  expect_close(b, full({8}, 0.5 + (pg.size() - 1) * 0.25, kBF16), 0, 0);
}

TEST(WorldGroup, WorkIsAsynchronous) {
  // Rank 0 issues an allreduce that the others join only after rank 0 tells them to (over a
  // second group): the call must return, incomplete, so rank 0 can go on and send.
  auto group = make_group(test_options());
  ProcessGroup& pg = *group;
  auto signal_group = make_group(test_options());
  ProcessGroup& signal = *signal_group;
  if (pg.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  Tensor t = full({1000}, pg.rank() + 1, kF64);
  Tensor flag = zeros({1}, kI32);
  if (pg.rank() == 0) {
    WorkHandle work = pg.allreduce(t);
    EXPECT_FALSE(work->is_completed());
    Tensor busy = matmul(ones({64, 64}), ones({64, 64}));  // the caller keeps computing
    EXPECT_FALSE(work->is_completed());
    flag.fill_(1);
    for (int r = 1; r < pg.size(); ++r) signal.send(flag, r)->wait();
    work->wait();
    EXPECT_TRUE(work->is_completed());
    EXPECT_EQ(busy.sum().item<float>(), 64.f * 64 * 64);
  } else {
    signal.recv(flag, 0)->wait();
    EXPECT_EQ(flag.item<int>(), 1);
    pg.allreduce(t)->wait();
  }
  expect_close(t, full({1000}, pg.size() * (pg.size() + 1) / 2.0, kF64));
}

TEST(WorldGroup, ManyInFlightCompleteInIssueOrder) {
  auto group = make_group(test_options());
  ProcessGroup& pg = *group;
  std::vector<Tensor> tensors;
  std::vector<WorkHandle> works;
  for (int k = 0; k < 24; ++k) {
    tensors.push_back(full({100 + 37 * k}, pg.rank() * 100 + k, kF32));
    works.push_back(k % 3 == 2 ? pg.broadcast(tensors.back(), k % pg.size())
                               : pg.allreduce(tensors.back(), ReduceOp::kMax));
  }
  // Waiting on the last one first: once it is done, every earlier one is too (issue order).
  works.back()->wait();
  for (auto& w : works) EXPECT_TRUE(w->is_completed());
  for (int k = 0; k < 24; ++k) {
    const double expected = k % 3 == 2 ? (k % pg.size()) * 100 + k : (pg.size() - 1) * 100 + k;
    expect_close(tensors[static_cast<size_t>(k)], full({100 + 37 * k}, expected, kF32));
  }
}

TEST(WorldGroup, BarrierWaitsForEveryRank) {
  auto group = make_group(test_options());
  ProcessGroup& pg = *group;
  // Rank 0 names a file, makes it after a pause, then enters the barrier; once out of the
  // barrier every rank must see it.
  Tensor token = full({1}, static_cast<int64_t>(getpid()), kI64);
  pg.broadcast(token, 0)->wait();
  const auto path = std::filesystem::temp_directory_path() /
                    ("ember_barrier_" + std::to_string(token.item<int64_t>()));
  if (pg.rank() == 0) {
    std::this_thread::sleep_for(200ms);
    std::ofstream(path) << "here";
  }
  pg.barrier()->wait();
  EXPECT_TRUE(std::filesystem::exists(path));
  pg.barrier()->wait();
  if (pg.rank() == 0) std::filesystem::remove(path);
}

TEST(WorldGroup, NeverTimingOutIsAllowed) {
  // milliseconds::max() must not overflow the deadlines computed from it into a spurious
  // timeout, neither as the group's timeout nor as one wait's.
  ProcessGroupOptions never;
  never.timeout = std::chrono::milliseconds::max();
  auto group = make_group(never);
  Tensor t = full({8}, 1.0);
  group->allreduce(t)->wait();
  group->barrier()->wait(std::chrono::milliseconds::max());
  WorkHandle later = group->allreduce(t);
  std::this_thread::sleep_for(5ms);  // started by the group's own thread
  later->wait(std::chrono::milliseconds::max());
  expect_close(t, full({8}, static_cast<double>(group->size() * group->size())), 0, 0);
}

TEST(WorldGroup, SendRecvRingWithTags) {
  auto group = make_group(test_options());
  ProcessGroup& pg = *group;
  if (pg.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int next = (pg.rank() + 1) % pg.size();
  const int prev = (pg.rank() + pg.size() - 1) % pg.size();
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    // Two messages per neighbour; the receiver takes them in the other order, by tag. Large
    // ones (1 Mi elements) need the receiver before they complete: sends must not block recvs.
    Tensor a = rank_tensor(pg.rank(), {1 << 20}, dtype);
    Tensor b = rank_tensor(pg.rank(), {7}, dtype, 3);
    Tensor got_a = zeros({1 << 20}, dtype), got_b = zeros({7}, dtype);
    auto s1 = pg.send(a, next, 1);
    auto s2 = pg.send(b, next, 2);
    auto r2 = pg.recv(got_b, prev, 2);
    auto r1 = pg.recv(got_a, prev, 1);
    r1->wait();
    r2->wait();
    s1->wait();
    s2->wait();
    expect_close(got_a, rank_tensor(prev, {1 << 20}, dtype));
    expect_close(got_b, rank_tensor(prev, {7}, dtype, 3));
  }
}

TEST(WorldGroup, WaitedCollectivesBesideSendsAndRecvsInFlight) {
  auto group = make_group(test_options());
  ProcessGroup& pg = *group;
  if (pg.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  // A recv in flight while lone collectives are waited on (which the TCP backend runs on the
  // waiting thread): neither holds the other up, and the send issued after them is matched.
  const int next = (pg.rank() + 1) % pg.size();
  const int prev = (pg.rank() + pg.size() - 1) % pg.size();
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE(round);
    Tensor got = zeros({5});
    auto r = pg.recv(got, prev, round);
    for (int k = 0; k < 3; ++k) {
      Tensor t = rank_tensor(pg.rank(), {3 + round}, kF32);
      pg.allreduce(t)->wait();
      expect_close(t, expected_reduction(pg.size(), {3 + round}, kF32, ReduceOp::kSum));
    }
    auto s = pg.send(rank_tensor(pg.rank(), {5}, kF32, round), next, round);
    Tensor b = rank_tensor(pg.rank(), {4}, kF64);
    pg.broadcast(b, round % pg.size())->wait();
    expect_close(b, rank_tensor(round % pg.size(), {4}, kF64));
    r->wait();
    s->wait();
    expect_close(got, rank_tensor(prev, {5}, kF32, round));
  }
}

// Without debug mode: the fingerprints every rank exchanges before each collective.
TEST(WorldGroup, MismatchesNameEveryRanksCall) {
  auto group = make_group(test_options());
  ProcessGroup& pg = *group;
  if (pg.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  // Same collective, different shape on every rank but 0.
  Tensor t = ones({pg.rank() == 0 ? 4 : 5});
  const std::string others = pg.size() == 2 ? "rank 1" : "ranks 1, 2";
  EXPECT_EMBER_ERROR(pg.allreduce(t)->wait(),
                     "allreduce #1 on rank " + std::to_string(pg.rank()) +
                         ": the ranks issued different collectives: rank 0 issued allreduce #1 "
                         "on f32 [4] (sum); " +
                         others + " issued allreduce #1 on f32 [5] (sum)");
  // A different collective on the last rank.
  Tensor u = ones({3});
  WorkHandle w = pg.rank() == pg.size() - 1 ? pg.broadcast(u, 0) : pg.allreduce(u);
  EXPECT_EMBER_ERROR(w->wait(), "rank " + std::to_string(pg.size() - 1) + " issued broadcast #2");
  // Every rank reported and skipped the collective, so the group goes on working.
  Tensor v = ones({6}, kF64);
  pg.allreduce(v)->wait();
  expect_close(v, full({6}, pg.size(), kF64));
}

TEST(WorldGroup, DebugModeAgreesOnMatchingCollectives) {
  auto group = make_group(test_options(/*debug=*/true));
  ProcessGroup& pg = *group;
  check_reduce_scatter(pg);
  check_broadcast(pg);
  pg.barrier()->wait();
}

TEST(WorldGroup, ArgumentErrors) {
  auto group = make_group(test_options());
  ProcessGroup& pg = *group;
  EXPECT_EMBER_ERROR(pg.allreduce(ones({4}, kI64), ReduceOp::kAvg),
                     "allreduce: ReduceOp avg needs a floating-point tensor, got i64");
  EXPECT_EMBER_ERROR(pg.allreduce(ones({4, 3}).t()), "allreduce: tensor must be contiguous");
  EXPECT_EMBER_ERROR(pg.broadcast(ones({2}), pg.size()), "is not a rank of a group of");
  EXPECT_EMBER_ERROR(pg.allgather({ones({3})}, ones({2})),
                     pg.size() == 1 ? "outputs[0] is f32 [3]" : "outputs holds 1 tensors");
  EXPECT_EMBER_ERROR(pg.send(ones({2}), pg.rank()), "cannot exchange with itself");
  if (pg.backend() == "mpi") {  // MPI counts in an int; only all-reduces go in pieces
    EXPECT_EMBER_ERROR(pg.broadcast(empty({int64_t{INT_MAX} + 1}, kU8), 0),
                       "broadcast: the MPI backend moves at most 2147483647 elements per call, "
                       "got 2147483648");
  }
  // Nothing was issued, so the group is still in step.
  Tensor t = ones({2});
  pg.allreduce(t)->wait();
  expect_close(t, full({2}, pg.size(), kF32));
}

TEST(WorldGroup, CudaTensorsAreStagedThroughHostOrRefused) {
  EMBER_REQUIRE_CUDA();
  auto group = make_group(test_options());
  ProcessGroup& pg = *group;
  const Device device = cuda_device(pg.local_rank() % cuda::device_count());
  if (pg.backend() == "tcp") {
    Tensor t = ones({4}, TensorOptions(kF32, device));
    EXPECT_EMBER_ERROR(pg.allreduce(t), "allreduce: the tcp backend moves CPU tensors only");
    EXPECT_EMBER_ERROR(pg.send(t, (pg.rank() + 1) % pg.size()), "send: the tcp backend");
    return;
  }
  check_allreduce(pg, {4, 25}, device);
  check_broadcast(pg, device);
  check_allgather(pg, device);
  check_reduce(pg, device);
  check_reduce_scatter(pg, device);
  for (DType dtype : {kF32, kF16, kI64}) {
    Tensor t = rank_tensor(pg.rank(), {1000}, dtype).to(device);
    pg.allreduce(t, ReduceOp::kSum)->wait();
    expect_close(t.cpu(), expected_reduction(pg.size(), {1000}, dtype, ReduceOp::kSum),
                 rtol_for(dtype));
    Tensor b = rank_tensor(pg.rank(), {33}, dtype).to(device);
    pg.broadcast(b, 0)->wait();
    expect_close(b.cpu(), rank_tensor(0, {33}, dtype));
  }
}

// --- the TCP backend -----------------------------------------------------------------------

TEST(TcpGroup, WorldOfOneNeedsNoNetwork) {
  TcpProcessGroup pg("", 0, 0, 1, 0, test_options());
  EXPECT_EQ(pg.backend(), "tcp");
  check_allreduce(pg, {3, 4});
  check_broadcast(pg);
  check_allgather(pg);
  check_reduce(pg);
  check_reduce_scatter(pg);
  pg.barrier()->wait();
  EXPECT_EMBER_ERROR(pg.send(ones({2}), 0), "cannot exchange with itself");
}

TEST(TcpGroup, BadBootstrapArguments) {
  EXPECT_EMBER_ERROR(TcpProcessGroup("127.0.0.1", 0, 0, 2, 0, test_options()),
                     "MASTER_ADDR and MASTER_PORT must name rank 0's address and a TCP port");
  EXPECT_EMBER_ERROR(TcpProcessGroup("127.0.0.1", 29500, 2, 2, 0, test_options()),
                     "rank 2 is not in a group of 2");
}

// A loopback port nothing listens on right now.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t length = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  ::close(fd);
  return ntohs(addr.sin_port);
}

TEST(TcpGroup, BootstrapWaitOutlastsSignals) {
  // Rank 0 of 2, alone: a signal while it waits for rank 1's connections must not turn the
  // bounded wait into a blocking accept; the missing rank is reported after the timeout.
  struct sigaction ignore {
  }, old{};
  ignore.sa_handler = [](int) {};
  sigemptyset(&ignore.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &ignore, &old), 0);
  ProcessGroupOptions options;
  options.timeout = 1500ms;
  auto result = std::make_shared<std::promise<std::string>>();
  auto outcome = result->get_future();
  std::thread rank0([result, options, port = free_port()] {
    try {
      TcpProcessGroup pg("127.0.0.1", port, 0, 2, 0, options);
      result->set_value("constructed");
    } catch (const std::exception& e) {
      result->set_value(e.what());
    }
  });
  std::this_thread::sleep_for(500ms);  // well into the wait for connections
  pthread_kill(rank0.native_handle(), SIGUSR1);
  const bool done = outcome.wait_for(20s) == std::future_status::ready;
  if (done) {
    rank0.join();
    EXPECT_NE(outcome.get().find("rank 0 waited 1500 ms for 2 connections from higher ranks"),
              std::string::npos);
  } else {
    rank0.detach();  // stuck for good: report rather than hang the suite
    ADD_FAILURE() << "TcpProcessGroup still waiting 20 s after its 1.5 s timeout";
  }
  sigaction(SIGUSR1, &old, nullptr);
}

TEST(TcpGroup, OneStorePerMasterPort) {
  if (test_backend() != "tcp") GTEST_SKIP() << "runs on the tcp backend";
  auto group = make_group(test_options());
  // The NCCL bootstrap meets over the same MASTER_PORT as the TCP groups: it must get the
  // process's store, not serve the port a second time on rank 0.
  const LaunchEnv launch = read_launch_env();
  auto store = detail::shared_store(launch.master_addr, launch.master_port, launch.world_size,
                                    launch.rank, 5s);
  EXPECT_EQ(store, detail::shared_store(launch.master_addr, launch.master_port, launch.world_size,
                                        launch.rank, 60s));
  const int64_t meeting = store->add("test/meetings/" + std::to_string(group->rank()), 1);
  const std::string key = "test/" + std::to_string(meeting) + "/id";
  if (group->rank() == 0) store->set(key, "from rank 0");
  EXPECT_EQ(store->get(key), "from rank 0");
  group->barrier()->wait();
}

TEST(TcpGroup, LargeMessagesCrossChunkBoundaries) {
  if (test_backend() != "tcp") GTEST_SKIP() << "runs on the tcp backend";
  auto group = make_group(test_options());
  ProcessGroup& pg = *group;
  // Sizes around the 1 MiB chunks and not divisible by the world size.
  for (const int64_t n : {int64_t{262144} * 3 + 1, int64_t{1000003}}) {
    Tensor t = rank_tensor(pg.rank(), {n}, kF32);
    pg.allreduce(t, ReduceOp::kSum)->wait();
    expect_close(t, expected_reduction(pg.size(), {n}, kF32, ReduceOp::kSum));
    Tensor h = rank_tensor(pg.rank(), {n}, kBF16);
    pg.allreduce(h, ReduceOp::kMax)->wait();
    expect_close(h, expected_reduction(pg.size(), {n}, kBF16, ReduceOp::kMax), 0, 0);
    Tensor b = rank_tensor(pg.rank(), {n}, kF64);
    pg.broadcast(b, pg.size() - 1)->wait();
    expect_close(b, rank_tensor(pg.size() - 1, {n}, kF64));
  }
}

TEST(TcpGroup, DifferentShapesAreReportedNotMixedUp) {
  if (test_backend() != "tcp") GTEST_SKIP() << "runs on the tcp backend";
  auto group = make_group(test_options());
  ProcessGroup& pg = *group;
  // The fingerprints catch it before any data moves: every rank names both shapes and skips
  // the collective, and the group goes on working.
  Tensor t = ones({pg.rank() == 0 ? 4 : 5});
  EXPECT_EMBER_ERROR(pg.allreduce(t)->wait(), "rank 0 issued allreduce #1 on f32 [4] (sum); rank");
  Tensor u = ones({3});
  pg.allreduce(u)->wait();
  expect_close(u, full({3}, static_cast<float>(pg.size())));
}

TEST(TcpGroup, RecvOfTheWrongSizeIsAnError) {
  if (test_backend() != "tcp") GTEST_SKIP() << "runs on the tcp backend";
  auto group = make_group(test_options());
  ProcessGroup& pg = *group;
  if (pg.rank() == 0) {
    pg.send(ones({4}), 1, 3)->wait();  // buffered by rank 1 whatever it makes of it
  } else if (pg.rank() == 1) {
    EXPECT_EMBER_ERROR(pg.recv(zeros({5}), 0, 3)->wait(),
                       "recv #1: rank 1 receives f32 [5] (20 bytes) with tag 3 but rank 0 sent "
                       "send #1 (tag 3, 16 bytes of f32)");
  }
}

// --- the single-process backend -----------------------------------------------------------

TEST(SingleGroup, EveryCollectiveIsTheIdentity) {
  SingleProcessGroup pg;
  EXPECT_EQ(pg.backend(), "single");
  EXPECT_EQ(pg.size(), 1);
  EXPECT_EQ(pg.rank(), 0);
  check_allreduce(pg, {3, 4});
  check_broadcast(pg);
  check_allgather(pg);
  check_reduce(pg);
  check_reduce_scatter(pg);
  auto w = pg.barrier();
  EXPECT_TRUE(w->is_completed());
  w->wait();
}

TEST(SingleGroup, ErrorsAndPointToPoint) {
  SingleProcessGroup pg;
  EXPECT_EMBER_ERROR(pg.send(ones({2}), 1), "send: the single-process group has no rank 1");
  EXPECT_EMBER_ERROR(pg.recv(ones({2}), 1), "recv: the single-process group has no rank 1");
  EXPECT_EMBER_ERROR(pg.broadcast(ones({2}), 1), "broadcast: root 1 is not a rank of a group of 1");
  EXPECT_EMBER_ERROR(pg.allreduce(ones({2}, kBool), ReduceOp::kAvg), "ReduceOp avg");
  EXPECT_EMBER_ERROR(pg.reduce_scatter(ones({2}), {ones({3})}), "inputs[0] is f32 [3]");
}

TEST(SingleGroup, CudaTensors) {
  EMBER_REQUIRE_CUDA();
  SingleProcessGroup pg;
  Tensor in = arange(6, TensorOptions(kF32, cuda_device())).view({2, 3});
  std::vector<Tensor> out = {zeros({2, 3}, TensorOptions(kF32, cuda_device()))};
  pg.allgather(out, in)->wait();
  expect_close(out[0].cpu(), in.cpu());
}

// --- the NCCL backend: a world of one on GPU 0 (more ranks need a GPU each) --------------

#if EMBER_WITH_CUDA
std::shared_ptr<NcclProcessGroup> nccl_world_of_one() {
  return std::make_shared<NcclProcessGroup>(0, 1, 0, 0, NcclProcessGroup::create_unique_id(),
                                            test_options());
}

TEST(NcclGroup, EveryCollectiveAndDtypeOnAWorldOfOne) {
  EMBER_REQUIRE_CUDA();
  auto group = nccl_world_of_one();
  NcclProcessGroup& pg = *group;
  EXPECT_EQ(pg.backend(), "nccl");
  EXPECT_EQ(pg.rank(), 0);
  EXPECT_EQ(pg.size(), 1);
  EXPECT_EQ(pg.device(), 0);
  const Device gpu = cuda_device(0);
  check_allreduce(pg, {4, 25}, gpu);
  check_allreduce(pg, {0}, gpu);
  check_broadcast(pg, gpu);
  check_allgather(pg, gpu);
  check_reduce(pg, gpu);
  check_reduce_scatter(pg, gpu);
  pg.barrier()->wait();
}

// An out-of-place collective reads what the caller's stream wrote just before it, and the
// caller's stream reads its output after wait(): on the default stream and on one of the
// caller's own. The input is large enough that its kernel is still running at the issue.
TEST(NcclGroup, OrderedAgainstTheCallersStream) {
  EMBER_REQUIRE_CUDA();
  auto group = nccl_world_of_one();
  const Device gpu = cuda_device(0);
  Generator gen(5);
  const Tensor x = rand({1 << 24}, kF32, &gen).to(gpu);
  for (const bool own_stream : {false, true}) {
    SCOPED_TRACE(own_stream ? "own stream" : "default stream");
    std::optional<cuda::StreamGuard> guard;
    if (own_stream) guard.emplace(cuda::Stream::create(0));
    Tensor produced = x * 3.0 + 1.0;
    std::vector<Tensor> gathered = {zeros({1 << 24}, gpu)};
    WorkHandle work = group->allgather(gathered, produced);
    work->wait();
    Tensor consumed = gathered[0] - 1.0;
    expect_close(consumed.cpu(), (x * 3.0).cpu(), 1e-6, 1e-6);
    EXPECT_TRUE(work->is_completed());
  }
}

TEST(NcclGroup, RefusesWhatItCannotMoveAndStaysUsable) {
  EMBER_REQUIRE_CUDA();
  auto group = nccl_world_of_one();
  NcclProcessGroup& pg = *group;
  const Device gpu = cuda_device(0);
  EXPECT_EMBER_ERROR(pg.allreduce(ones({2})), "the NCCL group works on cuda:0 but the tensor");
  EXPECT_EMBER_ERROR(pg.send(ones({2}, gpu), 0, 1), "the NCCL backend has no tags (got 1)");
  EXPECT_EMBER_ERROR(pg.recv(ones({2}, gpu), 0, 7), "the NCCL backend has no tags (got 7)");
  EXPECT_EMBER_ERROR(pg.send(ones({2}, gpu), 0), "rank 0 cannot exchange with itself");
  EXPECT_EMBER_ERROR(pg.allreduce(ones({2}, TensorOptions(kI64, gpu)), ReduceOp::kAvg),
                     "ReduceOp avg");
  Tensor t = full({3}, 2.0, TensorOptions(kF32, gpu));
  pg.allreduce(t)->wait();
  expect_close(t.cpu(), full({3}, 2.0));
}

// Keeps the current stream busy for about `seconds` (longer on a shared GPU) with matrix
// products queued at once: a delay that ends on its own, needing nothing from the host. (A
// host function holding a stream can deadlock CUDA calls made while it waits.)
void keep_stream_busy(double seconds) {
  const Device gpu = cuda_device(0);
  Generator gen(3);
  const Tensor a = rand({16384, 16384}, TensorOptions(kF32, gpu), &gen);  // 1 GiB
  Tensor product = matmul(a, a);  // loads the kernels, then times a few
  cuda::current_stream().synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) product = matmul(a, a);
  cuda::current_stream().synchronize();
  const double each =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 3;
  // Fewer than CUDA's queue of pending launches, which would hold the host; at least 3 (over
  // 50 ms even with TF32), should other tests share the GPU while these were timed.
  const int count = std::clamp(static_cast<int>(seconds / each) + 1, 3, 800);
  for (int i = 0; i < count; ++i) product = matmul(a, a);
}

// wait() with the group's timeout orders the caller's stream after the collective and
// returns at once, like PyTorch's NCCL Work: the host is not held while the GPU communicates.
// The all-gather is out of place, so the NCCL stream has work of its own (a copy at one rank).
TEST(NcclGroup, WaitOrdersTheCallersStreamWithoutHoldingTheHost) {
  EMBER_REQUIRE_CUDA();
  auto group = nccl_world_of_one();
  const Device gpu = cuda_device(0);
  cuda::StreamGuard guard(cuda::Stream::create(0));
  Tensor input = full({1000}, 3.0, gpu);
  std::vector<Tensor> out = {zeros({1000}, gpu)};
  group->allgather(out, input)->wait();  // NCCL's first use of the collective
  out[0].zero_();
  keep_stream_busy(2.0);
  WorkHandle work = group->allgather(out, input);
  work->wait();
  EXPECT_FALSE(work->is_completed()) << "wait() held the host until the collective was done";
  Tensor doubled = out[0] * 2.0;  // queued after the collective
  expect_close(doubled.cpu(), full({1000}, 6.0));
  EXPECT_TRUE(work->is_completed());
}

// Under ProcessGroupOptions::blocking_wait every wait holds the host until the collective is
// done, as PyTorch's TORCH_NCCL_BLOCKING_WAIT does.
TEST(NcclGroup, BlockingWaitHoldsTheHost) {
  EMBER_REQUIRE_CUDA();
  ProcessGroupOptions options = test_options();
  options.blocking_wait = true;
  NcclProcessGroup pg(0, 1, 0, 0, NcclProcessGroup::create_unique_id(), options);
  const Device gpu = cuda_device(0);
  cuda::StreamGuard guard(cuda::Stream::create(0));
  Tensor input = full({1000}, 3.0, gpu);
  std::vector<Tensor> out = {zeros({1000}, gpu)};
  pg.allgather(out, input)->wait();
  out[0].zero_();
  keep_stream_busy(1.0);
  WorkHandle work = pg.allgather(out, input);
  work->wait();
  EXPECT_TRUE(work->is_completed());
  expect_close(out[0].cpu(), full({1000}, 3.0));
}

// NCCL moves CUDA tensors only, so the metric helpers send their values through its GPU.
TEST(NcclGroup, AverageAcrossRanksTravelsThroughTheGroupsGpu) {
  EMBER_REQUIRE_CUDA();
  auto group = nccl_world_of_one();
  EXPECT_EQ(group->tensor_device(), cuda_device(group->device()));
  const auto mean = average_across_ranks({{"loss", 2.5}, {"accuracy", 0.75}}, *group);
  EXPECT_DOUBLE_EQ(mean.at("loss"), 2.5);
  EXPECT_DOUBLE_EQ(mean.at("accuracy"), 0.75);
}

// A collective that cannot start in time (its input is still being computed) makes an
// explicit wait raise the error once its timeout passes, and the group refuses later calls.
TEST(NcclGroup, AnExplicitWaitTimesOutAndBreaksTheGroup) {
  EMBER_REQUIRE_CUDA();
  auto group = nccl_world_of_one();
  const Device gpu = cuda_device(0);
  cuda::StreamGuard guard(cuda::Stream::create(0));
  Tensor input = ones({4}, gpu);
  std::vector<Tensor> out = {zeros({4}, gpu)};
  group->allgather(out, input)->wait();
  keep_stream_busy(2.0);
  WorkHandle work = group->allgather(out, input);
  EXPECT_EMBER_ERROR(work->wait(50ms), "allgather #2 on rank 0 timed out after 50 ms");
  EXPECT_EMBER_ERROR(group->allgather(out, input), "cannot be used after an earlier failure");
  EXPECT_TRUE(work->is_completed());
}

// With nobody blocked on it, a collective that does not finish in time is reported by the
// watchdog, which ends the process with a non-zero status.
TEST(NcclGroupDeathTest, TheWatchdogEndsTheProcessPastTheTimeout) {
  EMBER_REQUIRE_CUDA();
  if (read_launch_env().launcher != "none") GTEST_SKIP() << "runs without a launcher";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        ProcessGroupOptions options;
        options.timeout = 5s;  // it bounds NCCL's initialisation too: ~0.5 s, more on a busy GPU
        NcclProcessGroup pg(0, 1, 0, 0, NcclProcessGroup::create_unique_id(), options);
        cuda::StreamGuard guard(cuda::Stream::create(0));
        Tensor input = ones({4}, cuda_device(0));
        std::vector<Tensor> out = {zeros({4}, cuda_device(0))};
        pg.allgather(out, input)->wait();
        keep_stream_busy(60.0);
        pg.allgather(out, input)->wait();
        std::this_thread::sleep_for(60s);
        std::exit(0);
      },
      ::testing::ExitedWithCode(1), "allgather #2 on rank 0 timed out after 5000 ms");
}

TEST(NcclGroup, InitProcessGroupMakesAWorldOfOneWhenAsked) {
  EMBER_REQUIRE_CUDA();
  if (read_launch_env().launcher != "none") GTEST_SKIP() << "runs without a launcher";
  InitOptions init;
  init.backend = "nccl";
  init.group = test_options();
  testing::DefaultGroupGuard guard;
  auto pg = init_process_group(init);
  EXPECT_EQ(pg->backend(), "nccl");
  Tensor t = ones({8}, cuda_device(0));
  pg->allreduce(t, ReduceOp::kAvg)->wait();
  expect_close(t.cpu(), ones({8}));
}
#endif  // EMBER_WITH_CUDA

// --- fingerprints -------------------------------------------------------------------------

TEST(Fingerprint, DescribesAndComparesCollectives) {
  Tensor t = ones({2, 3}, kBF16);
  const auto a = detail::Fingerprint::of(detail::OpKind::kAllreduce, 4, &t, -1, 1);
  EXPECT_EQ(a.str(), "allreduce #4 on bf16 [2, 3] (avg)");
  Tensor u = ones({1, 2, 3, 4, 5, 6, 7});
  const auto b = detail::Fingerprint::of(detail::OpKind::kBroadcast, 4, &u, 1, -1);
  EXPECT_EQ(b.str(), "broadcast #4 on f32 [1, 2, 3, 4, 5, 6, ...] (root 1)");
  EXPECT_NO_THROW(detail::check_fingerprints("allreduce #4", {a, a, a}, 2));
  // A mismatch names every rank's call, grouped, and leaves the group usable.
  try {
    detail::check_fingerprints("allreduce #4", {a, b, a}, 0);
    ADD_FAILURE() << "no mismatch reported";
  } catch (const detail::FingerprintMismatch& e) {
    EXPECT_NE(std::string(e.what()).find("allreduce #4 on rank 0: the ranks issued different "
                                         "collectives: ranks 0, 2 issued allreduce #4 on bf16 "
                                         "[2, 3] (avg); rank 1 issued broadcast #4"),
              std::string::npos)
        << e.what();
  }
  // A goodbye names who left after which collective, and where the others wait; the group
  // breaks (a plain ember::Error).
  const auto bye = detail::Fingerprint::goodbye(3, static_cast<int32_t>(detail::OpKind::kBarrier));
  EXPECT_EQ(bye.str(), "left the group after barrier #3");
  EXPECT_EQ(detail::Fingerprint::goodbye(0, 0).str(), "left the group before any collective");
  bool broke = false;
  try {
    detail::check_fingerprints("allreduce #4", {a, bye, a}, 2);
  } catch (const detail::FingerprintMismatch&) {
    ADD_FAILURE() << "a goodbye must break the group";
  } catch (const Error& e) {
    broke = true;
    EXPECT_NE(std::string(e.what()).find(
                  "allreduce #4 on rank 2: rank 1 left the group after barrier #3 "
                  "(destroy_process_group, the group's destruction or the process's exit), "
                  "while ranks 0, 2 waited in allreduce #4"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(broke);
  // Every rank leaving together is no failure.
  EXPECT_NO_THROW(detail::check_fingerprints("allreduce #4", {bye, bye}, 0));
  // Shapes that differ only past the dims kept are still told apart by the hash.
  Tensor v = ones({1, 2, 3, 4, 5, 6, 8});
  EXPECT_FALSE(b == detail::Fingerprint::of(detail::OpKind::kBroadcast, 4, &v, 1, -1));
}

}  // namespace
}  // namespace ember::dist
