// The default process group and torch.distributed's free functions, written as a PyTorch user
// writes them. Run alone (the single-process backend), under mpirun (mpi) and torchrun-style
// (tcp): the answers are checked against the world the launcher made.
#include <chrono>
#include <string>
#include <vector>

#include <ember/dist/dist.h>

#include "dist_test_util.h"
#include "test_util.h"

namespace ember::dist {
namespace {

using ::ember::testing::expect_close;
using testing::cpu_init;

// The backend init_process_group() picks on the CPU for the launcher that started the test:
// MPI for mpirun, and for srun without MASTER_ADDR; TCP for torchrun-style launches.
std::string launched_backend() {
  const LaunchEnv launch = read_launch_env();
  if (launch.launcher == "none") return "single";
  if (launch.launcher == "mpirun" || (launch.launcher == "slurm" && launch.master_addr.empty()))
    return "mpi";
  return "tcp";
}

constexpr const char* kNotInitialized =
    "the default process group is not initialized; call init_process_group() first";

TEST(DefaultGroup, SecondInitThrowsAndDestroyThenInitWorks) {
  testing::DefaultGroupGuard guard;
  ASSERT_FALSE(is_initialized());
  auto pg = init_process_group(cpu_init());
  EXPECT_TRUE(is_initialized());
  EXPECT_EQ(get_default_group(), pg);
  EXPECT_EMBER_ERROR(init_process_group(cpu_init()),
                     "init_process_group: the default process group is already initialized (" +
                         launched_backend() + " backend");
  EXPECT_EMBER_ERROR(init_process_group(cpu_init()), "call destroy_process_group() first");
  EXPECT_EQ(get_default_group(), pg);  // the refused call left the first group in place

  destroy_process_group();
  EXPECT_FALSE(is_initialized());
  auto again = init_process_group(cpu_init());
  EXPECT_NE(again, pg);
  Tensor t = ones({4}, kI64);
  all_reduce(t);
  expect_close(t, full({4}, get_world_size(), kI64));
  // The first group, still held here, works on as a group of its own.
  Tensor u = ones({2});
  pg->allreduce(u)->wait();
  expect_close(u, full({2}, pg->size()));
  destroy_process_group();
  EXPECT_FALSE(is_initialized());
}

TEST(DefaultGroup, EveryFunctionBeforeInitTellsToInitFirst) {
  ASSERT_FALSE(is_initialized());
  Tensor t = ones({3});
  std::vector<Tensor> list = {zeros({3})};
  EXPECT_EMBER_ERROR(get_rank(), std::string("get_rank: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(get_world_size(), std::string("get_world_size: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(get_local_rank(), std::string("get_local_rank: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(get_backend(), std::string("get_backend: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(get_default_group(), std::string("get_default_group: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(all_reduce(t), std::string("all_reduce: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(all_reduce(t, ReduceOp::kSum, true),
                     std::string("all_reduce: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(reduce(t, 0), std::string("reduce: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(broadcast(t, 0), std::string("broadcast: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(all_gather(list, t), std::string("all_gather: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(reduce_scatter(t, list), std::string("reduce_scatter: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(barrier(), std::string("barrier: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(send(t, 1), std::string("send: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(recv(t, 1), std::string("recv: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(isend(t, 1), std::string("isend: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(irecv(t, 1), std::string("irecv: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(destroy_process_group(),
                     std::string("destroy_process_group: ") + kNotInitialized);
  expect_close(t, ones({3}));  // untouched
}

TEST(DefaultGroup, FunctionsAfterDestroyTellToInitFirst) {
  testing::DefaultGroupGuard guard;
  init_process_group(cpu_init());  // the result dropped, as in PyTorch: the default group holds it
  Tensor t = ones({2});
  all_reduce(t);
  expect_close(t, full({2}, get_world_size()));
  destroy_process_group();
  EXPECT_EMBER_ERROR(all_reduce(t), std::string("all_reduce: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(barrier(), std::string("barrier: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(get_rank(), std::string("get_rank: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(destroy_process_group(),
                     std::string("destroy_process_group: ") + kNotInitialized);
}

TEST(DefaultGroup, FreeFunctionsGiveTorchDistributedAnswers) {
  testing::DefaultGroupGuard guard;
  init_process_group(cpu_init());
  const LaunchEnv launch = read_launch_env();
  const int rank = get_rank();
  const int n = get_world_size();
  EXPECT_EQ(rank, launch.rank);
  EXPECT_EQ(n, launch.world_size);
  EXPECT_EQ(get_local_rank(), launch.local_rank);
  EXPECT_EQ(get_backend(), launched_backend());

  // all_reduce, in place: rank r holds [r + 1, 2(r + 1), 3(r + 1)].
  const double tri = n * (n + 1) / 2.0;
  const auto k = static_cast<float>(rank + 1);
  Tensor x = from_vector<float>({k, 2 * k, 3 * k});
  all_reduce(x);
  const auto t3 = static_cast<float>(tri);
  expect_close(x, from_vector<float>({t3, 2 * t3, 3 * t3}));
  Tensor avg = full({2}, static_cast<double>(rank));
  all_reduce(avg, ReduceOp::kAvg);
  expect_close(avg, full({2}, (n - 1) / 2.0));
  Tensor mx = from_vector<int64_t>({rank, -rank});
  all_reduce(mx, ReduceOp::kMax);
  expect_close(mx, from_vector<int64_t>({n - 1, 0}));
  Tensor mn = from_vector<int64_t>({rank, -rank});
  all_reduce(mn, ReduceOp::kMin);
  expect_close(mn, from_vector<int64_t>({0, -(n - 1)}));

  // async_op: a Work to wait on.
  Tensor a = full({4}, 2.0);
  WorkHandle work = all_reduce(a, ReduceOp::kSum, /*async_op=*/true);
  ASSERT_NE(work, nullptr);
  work->wait();
  EXPECT_TRUE(work->is_completed());
  expect_close(a, full({4}, 2.0 * n));
  // Without it the returned Work is already finished.
  Tensor b = ones({1});
  EXPECT_TRUE(all_reduce(b)->is_completed());

  // reduce to the last rank.
  const int last = n - 1;
  Tensor r = full({3}, static_cast<double>(rank + 1));
  reduce(r, last);
  if (rank == last) expect_close(r, full({3}, tri));

  // broadcast from the last rank.
  Tensor c = full({2, 2}, static_cast<double>(rank));
  broadcast(c, last);
  expect_close(c, full({2, 2}, static_cast<double>(last)));

  // all_gather: slot q holds rank q's tensor.
  std::vector<Tensor> gathered;
  for (int q = 0; q < n; ++q) gathered.push_back(zeros({2}, kI32));
  all_gather(gathered, from_vector<int32_t>({rank, 10 * rank}));
  for (int q = 0; q < n; ++q)
    expect_close(gathered[static_cast<size_t>(q)], from_vector<int32_t>({q, 10 * q}));

  // reduce_scatter: rank q gets the sum over ranks of their inputs[q] = (rank + 1) * (q + 1).
  std::vector<Tensor> inputs;
  for (int q = 0; q < n; ++q)
    inputs.push_back(full({3}, static_cast<double>((rank + 1) * (q + 1))));
  Tensor out = zeros({3});
  reduce_scatter(out, inputs);
  expect_close(out, full({3}, tri * (rank + 1)));

  barrier();
  WorkHandle fence = barrier(/*async_op=*/true);
  fence->wait();

  // Point to point: a ring, lower ranks sending first.
  if (n > 1) {
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    Tensor mine = full({3}, static_cast<double>(rank));
    Tensor theirs = zeros({3});
    WorkHandle sent = isend(mine, next, 3);
    recv(theirs, prev, 3);
    sent->wait();
    expect_close(theirs, full({3}, static_cast<double>(prev)));
    Tensor back = zeros({1}, kI64);
    WorkHandle got = irecv(back, next, 4);
    send(from_vector<int64_t>({rank}), prev, 4);
    got->wait();
    expect_close(back, from_vector<int64_t>({next}));
  } else {
    EXPECT_EMBER_ERROR(send(ones({1}), 0), "send");
  }
  destroy_process_group();
}

TEST(DefaultGroup, BadArgumentsNameTheFunction) {
  testing::DefaultGroupGuard guard;
  init_process_group(cpu_init());
  const int n = get_world_size();
  EXPECT_EMBER_ERROR(
      broadcast(ones({2}), n),
      "broadcast: root " + std::to_string(n) + " is not a rank of a group of " + std::to_string(n));
  EXPECT_EMBER_ERROR(all_reduce(ones({2}, kI32), ReduceOp::kAvg),
                     "allreduce: ReduceOp avg needs a floating-point tensor");
  std::vector<Tensor> too_few(static_cast<size_t>(n + 1), zeros({2}));
  EXPECT_EMBER_ERROR(all_gather(too_few, ones({2})), "allgather: outputs holds");
  // Refused calls leave the group usable.
  Tensor t = ones({2});
  all_reduce(t);
  expect_close(t, full({2}, n));
}

}  // namespace
}  // namespace ember::dist
