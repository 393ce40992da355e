// Subgroups (new_group) as a torch.distributed user makes them: collectives among the ends of
// the job ({0, 2} at 3 ranks) while the rank in between does something else, non-members
// refused, bad rank lists rejected, two subgroups used in interleaved order, the free
// functions' group argument, SyncBatchNorm and DDP within a subgroup.
#include <ember/dist/api.h>
#include <ember/dist/ddp.h>
#include <ember/dist/nccl_process_group.h>
#include <ember/dist/sync_batch_norm.h>

#include "dist_test_util.h"

namespace ember::dist {
namespace {

using ::ember::testing::expect_close;
using testing::world;

// The first and the last rank of a group of `size`: {0, 2} at 3 ranks, {0} at one.
std::vector<int> ends(int size) {
  return size > 1 ? std::vector<int>{0, size - 1} : std::vector<int>{0};
}

std::string members_str(const std::vector<int>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i > 0 ? ", " : "") + std::to_string(ranks[i]);
  return out + "]";
}

TEST(Subgroup, CollectivesAmongTheEndsWhileTheMiddleWorksAlone) {
  auto pg = world();
  const std::vector<int> members = ends(pg->size());
  auto group = pg->new_group(members);
  const bool member = pg->rank() == 0 || pg->rank() == pg->size() - 1;
  EXPECT_EQ(group->backend(), pg->backend());
  EXPECT_EQ(group->global_rank(), pg->rank());
  EXPECT_EQ(group->size(), static_cast<int>(members.size()));
  EXPECT_EQ(group->global_ranks(), members);
  if (!member) {
    // Rank 1 of 3: a group it can name but not use; it computes on its own meanwhile.
    EXPECT_EQ(group->rank(), -1);
    EXPECT_FALSE(group->is_member());
    const std::string refused = "this rank (global rank " + std::to_string(pg->rank()) +
                                ") is not a member of group " + members_str(members);
    Tensor t = ones({4});
    EXPECT_EMBER_ERROR(group->allreduce(t), "allreduce: " + refused);
    EXPECT_EMBER_ERROR(group->broadcast(t, 0), "broadcast: " + refused);
    EXPECT_EMBER_ERROR(group->allgather({t, t}, t), "allgather: " + refused);
    EXPECT_EMBER_ERROR(group->barrier(), "barrier: " + refused);
    EXPECT_EMBER_ERROR(group->send(t, 0), "send: " + refused);
    EXPECT_EMBER_ERROR(group->new_group({0}), "new_group: " + refused);
    expect_close(matmul(t.view({2, 2}), t.view({2, 2})), full({2, 2}, 2.0f), 0, 0);
  } else {
    const int r = group->rank();
    EXPECT_EQ(r, pg->rank() == 0 ? 0 : 1);
    EXPECT_EQ(group->global_rank(r), pg->rank());
    // all_reduce: the members' values only (the job's ranks 0 and n - 1 contribute r + 1).
    Tensor sum = full({5}, static_cast<double>(pg->rank() + 1), kF64);
    group->allreduce(sum)->wait();
    const double expected = pg->size() > 1 ? 1.0 + pg->size() : 1.0;
    expect_close(sum, full({5}, expected, kF64), 0, 0);
    Tensor avg = full({3}, static_cast<float>(pg->rank()), kF32);
    group->allreduce(avg, ReduceOp::kAvg)->wait();
    expect_close(avg, full({3}, (pg->size() - 1) / static_cast<float>(members.size())), 0, 1e-6);
    // broadcast: the root is a rank of the group (its last member: the job's last rank).
    const int root = group->size() - 1;
    Tensor b = full({2, 3}, static_cast<float>(10 * pg->rank()), kF32);
    group->broadcast(b, root)->wait();
    expect_close(b, full({2, 3}, static_cast<float>(10 * members.back())), 0, 0);
    // allgather: one slot per member, in group-rank order.
    std::vector<Tensor> gathered;
    for (int i = 0; i < group->size(); ++i) gathered.push_back(empty({2}, kI64));
    group->allgather(gathered, full({2}, int64_t{pg->rank()}, kI64))->wait();
    for (int i = 0; i < group->size(); ++i) {
      EXPECT_EQ(gathered[static_cast<size_t>(i)].to_vector<int64_t>(),
                std::vector<int64_t>(2, members[static_cast<size_t>(i)]));
    }
    // reduce to group rank 0, reduce_scatter, barrier.
    Tensor red = full({4}, static_cast<float>(pg->rank() + 1), kF32);
    group->reduce(red, 0, ReduceOp::kMax)->wait();
    if (r == 0) expect_close(red, full({4}, static_cast<float>(members.back() + 1)), 0, 0);
    std::vector<Tensor> inputs;
    for (int i = 0; i < group->size(); ++i)
      inputs.push_back(full({3}, static_cast<float>(100 * i + pg->rank()), kF32));
    Tensor scattered = empty({3}, kF32);
    group->reduce_scatter(scattered, inputs)->wait();
    float want = 0;
    for (const int m : members) want += static_cast<float>(100 * r + m);
    expect_close(scattered, full({3}, want), 0, 0);
    group->barrier()->wait();
    // send/recv between the two members, by group rank.
    if (group->size() == 2) {
      Tensor msg = full({3}, static_cast<float>(pg->rank()), kF32);
      if (r == 0) {
        group->send(msg, 1, 7)->wait();
      } else {
        Tensor got = empty({3}, kF32);
        group->recv(got, 0, 7)->wait();
        expect_close(got, zeros({3}), 0, 0);
      }
      EXPECT_EMBER_ERROR(group->send(msg, 2), "send: peer 2 is not a rank of a group of 2");
    }
    EXPECT_EMBER_ERROR(group->broadcast(b, group->size()),
                       "broadcast: root " + std::to_string(group->size()) +
                           " is not a rank of a group of " + std::to_string(group->size()));
  }
  // The whole job is still in step afterwards.
  Tensor all = ones({1});
  pg->allreduce(all)->wait();
  EXPECT_EQ(all.item<float>(), static_cast<float>(pg->size()));
}

TEST(Subgroup, BadRankListsAreRejectedOnEveryRank) {
  auto pg = world();
  const int n = pg->size();
  EXPECT_EMBER_ERROR(pg->new_group({}), "new_group: ranks is empty");
  EXPECT_EMBER_ERROR(pg->new_group({0, 0}), "new_group: rank 0 appears twice in [0, 0]");
  EXPECT_EMBER_ERROR(pg->new_group({0, n}),
                     "new_group: rank " + std::to_string(n) + " in [0, " + std::to_string(n) +
                         "] is not a rank of a group of " + std::to_string(n));
  EXPECT_EMBER_ERROR(pg->new_group({-1}), "new_group: rank -1 in [-1] is not a rank");
  // Refused lists made no group: the next one still meets its peers (same number everywhere).
  auto all = pg->new_group({0});
  Tensor t = ones({2});
  if (pg->rank() == 0) {
    all->allreduce(t)->wait();
    EXPECT_EQ(all->size(), 1);
  }
  auto whole = pg->new_group(ends(n));
  if (whole->is_member()) whole->barrier()->wait();
  pg->barrier()->wait();
}

// Unsorted lists are sorted, as PyTorch does: a member's rank is its place in sorted order.
TEST(Subgroup, RanksAreSortedLikePyTorch) {
  auto pg = world();
  std::vector<int> reversed;
  for (int r = pg->size() - 1; r >= 0; --r) reversed.push_back(r);
  auto group = pg->new_group(reversed);
  EXPECT_EQ(group->rank(), pg->rank());
  Tensor t = full({1}, static_cast<float>(pg->rank()), kF32);
  group->broadcast(t, 0)->wait();
  EXPECT_EQ(t.item<float>(), 0.0f);
}

// At 3 ranks: A = {0, 1} and B = {1, 2}; rank 1 issues on B before A and waits on A first,
// the others use their one group. Each group keeps its own order and traffic.
TEST(Subgroup, TwoSubgroupsInInterleavedOrder) {
  auto pg = world();
  const int n = pg->size();
  const std::vector<int> a_ranks = n >= 3 ? std::vector<int>{0, 1} : ends(n);
  const std::vector<int> b_ranks = n >= 3 ? std::vector<int>{1, 2} : ends(n);
  auto a = pg->new_group(a_ranks);
  auto b = pg->new_group(b_ranks);
  for (int round = 0; round < 3; ++round) {
    Tensor x = full({64}, static_cast<float>(pg->rank() + round), kF32);
    Tensor y = full({64}, static_cast<float>(10 * pg->rank() + round), kF32);
    WorkHandle wa, wb;
    if (b->is_member()) wb = b->allreduce(y);
    if (a->is_member()) wa = a->allreduce(x);
    if (wa) wa->wait();
    if (wb) wb->wait();
    if (a->is_member()) {
      float want = 0;
      for (const int m : a_ranks) want += static_cast<float>(m + round);
      expect_close(x, full({64}, want), 0, 0);
    }
    if (b->is_member()) {
      float want = 0;
      for (const int m : b_ranks) want += static_cast<float>(10 * m + round);
      expect_close(y, full({64}, want), 0, 0);
    }
  }
  // A subgroup of a subgroup: its ranks are the parent's.
  if (b->is_member()) {
    auto last = b->new_group({b->size() - 1});
    EXPECT_EQ(last->global_ranks(), std::vector<int>{b_ranks.back()});
    EXPECT_EQ(last->is_member(), pg->rank() == b_ranks.back());
  }
  pg->barrier()->wait();
}

// The free functions with PyTorch's group argument, on a subgroup made after the default
// group and destroyed before it.
TEST(Subgroup, FreeFunctionsTakeTheGroupAndItDiesBeforeTheDefault) {
  testing::DefaultGroupGuard guard;
  InitOptions init;
  init.device = kCPU;
  init.group.timeout = std::chrono::seconds(60);
  init_process_group(init);
  const int n = get_world_size();
  {
    auto group = new_group(ends(n));
    EXPECT_EQ(get_world_size(group), group->size());
    EXPECT_EQ(get_rank(group), group->rank());
    EXPECT_EQ(get_group_rank(group, n - 1), group->size() - 1);
    EXPECT_EQ(get_group_rank(group, n > 2 ? 1 : n), -1);
    EXPECT_EQ(get_global_rank(group, 0), 0);
    if (group->is_member()) {
      Tensor t = full({2}, 1.0f, kF32);
      all_reduce(t, ReduceOp::kSum, group);
      EXPECT_EQ(t.to_vector<float>(), std::vector<float>(2, static_cast<float>(group->size())));
      // src is a global rank, as in torch.distributed: the job's last rank.
      Tensor s = full({2}, static_cast<float>(get_rank()), kF32);
      broadcast(s, n - 1, group);
      EXPECT_EQ(s.to_vector<float>(), std::vector<float>(2, static_cast<float>(n - 1)));
      Tensor r = full({2}, static_cast<float>(get_rank() + 1), kF32);
      reduce(r, n - 1, ReduceOp::kSum, group);
      if (get_rank() == n - 1) {
        EXPECT_EQ(r.to_vector<float>(), std::vector<float>(2, n > 1 ? n + 1.0f : 1.0f));
      }
      if (n > 1) {
        if (get_rank() == 0) {
          send(full({2}, 5.0f, kF32), n - 1, group);
        } else {
          Tensor got = zeros({2});
          recv(got, 0, group);
          EXPECT_EQ(got.to_vector<float>(), std::vector<float>(2, 5.0f));
        }
      }
      if (n > 2) {
        EXPECT_EMBER_ERROR(broadcast(s, 1, group),
                           "broadcast: src 1 is not a member of group [0, " +
                               std::to_string(n - 1) + "] (src is a global rank");
      }
      barrier(group);
    } else {
      Tensor t = ones({2});
      EXPECT_EMBER_ERROR(all_reduce(t, ReduceOp::kSum, group),
                         "is not a member of group " + members_str(ends(n)));
      EXPECT_EQ(get_rank(group), -1);
    }
  }  // the subgroup goes first
  Tensor t = ones({1});
  all_reduce(t, ReduceOp::kSum, nullptr);  // null: the default group
  EXPECT_EQ(t.item<float>(), static_cast<float>(n));
  barrier();
  destroy_process_group();
}

// Debug mode carries over to the subgroup, which numbers its own collectives: a shape that
// differs between its members is named on both and leaves the subgroup usable.
TEST(Subgroup, DebugModeChecksTheSubgroupsOwnCollectives) {
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(60);
  options.debug = true;
  auto pg = testing::make_group(options);
  auto group = pg->new_group(ends(pg->size()));
  if (group->is_member() && group->size() == 2) {
    Tensor first = ones({4});
    group->allreduce(first)->wait();
    Tensor odd = ones({group->rank() == 0 ? 4 : 5});
    EXPECT_EMBER_ERROR(group->allreduce(odd)->wait(),
                       "allreduce #2 on rank " + std::to_string(group->rank()) +
                           ": the ranks issued different collectives: rank 0 issued allreduce "
                           "#2 on f32 [4] (sum); rank 1 issued allreduce #2 on f32 [5] (sum)");
    Tensor again = ones({3});
    group->allreduce(again)->wait();
    expect_close(again, full({3}, 2.0f), 0, 0);
  }
  pg->barrier()->wait();
}

// Rank r's batch: 2 + r rows, as SyncBatchNorm allows unequal shares.
int64_t rows_of(int r) { return 2 + r; }

// SyncBatchNorm within a subgroup (e.g. within a node) equals a BatchNorm over the members'
// batches put together, in f64: outputs, input gradients and running statistics.
TEST(Subgroup, SyncBatchNormWithinTheGroupIsBatchNormOverItsBatch) {
  auto pg = world();
  const std::vector<int> members = ends(pg->size());
  auto group = pg->new_group(members);
  std::vector<Tensor> xs, dys;
  for (int r = 0; r < pg->size(); ++r) {
    Generator gen(100 + static_cast<uint64_t>(r));
    xs.push_back(randn({rows_of(r), 3, 4}, kF64, &gen) * 1.5 + 0.5);
    dys.push_back(randn({rows_of(r), 3, 4}, kF64, &gen));
  }
  if (!group->is_member()) {
    // Rank 1 of 3 trains with a plain BatchNorm of its own meanwhile.
    nn::BatchNorm1d own(3);
    own.to(kF64);
    Tensor y = own(xs[static_cast<size_t>(pg->rank())]);
    EXPECT_EQ(y.sizes(), xs[static_cast<size_t>(pg->rank())].sizes());
    pg->barrier()->wait();
    return;
  }
  std::vector<Tensor> member_x, member_dy;
  for (const int m : members) {
    member_x.push_back(xs[static_cast<size_t>(m)]);
    member_dy.push_back(dys[static_cast<size_t>(m)]);
  }
  const Tensor x_all = cat(member_x, 0), dy_all = cat(member_dy, 0);
  nn::BatchNorm1d reference(3);
  SyncBatchNorm sync(3, group);
  reference.to(kF64);
  sync.to(kF64);
  for (nn::BatchNorm* bn :
       {static_cast<nn::BatchNorm*>(&reference), static_cast<nn::BatchNorm*>(&sync)}) {
    NoGradGuard no_grad;
    bn->weight.copy_(from_vector<double>({0.5, 1.5, -1.0}, {3}));
    bn->bias.copy_(from_vector<double>({0.1, -0.2, 0.3}, {3}));
  }
  Tensor x_ref = x_all.clone().requires_grad_();
  Tensor y_ref = reference(x_ref);
  (y_ref * dy_all).sum().backward();

  int64_t begin = 0;
  for (int i = 0; i < group->rank(); ++i) begin += rows_of(members[static_cast<size_t>(i)]);
  const int64_t rows = rows_of(pg->rank());
  Tensor x = xs[static_cast<size_t>(pg->rank())].clone().requires_grad_();
  Tensor y = sync(x);
  (y * dys[static_cast<size_t>(pg->rank())]).sum().backward();
  expect_close(y, y_ref.narrow(0, begin, rows), 1e-12, 1e-12);
  expect_close(x.grad(), x_ref.grad().narrow(0, begin, rows), 1e-12, 1e-12);
  expect_close(sync.running_mean, reference.running_mean, 1e-12, 1e-12);
  expect_close(sync.running_var, reference.running_var, 1e-12, 1e-12);
  Tensor weight_grad = sync.weight.grad().clone();
  group->allreduce(weight_grad)->wait();
  expect_close(weight_grad, reference.weight.grad(), 1e-12, 1e-12);
  pg->barrier()->wait();
}

// DDP over a subgroup averages the members' gradients only.
TEST(Subgroup, DistributedDataParallelWithinTheGroup) {
  auto pg = world();
  auto group = pg->new_group(ends(pg->size()));
  if (!group->is_member()) {
    pg->barrier()->wait();
    return;
  }
  auto model = std::make_shared<nn::Linear>(3, 1);
  {
    NoGradGuard no_grad;
    model->weight.fill_(0.0f);
    if (model->bias.defined()) model->bias.fill_(0.0f);
  }
  DistributedDataParallel ddp(model, group);
  // Member m's input is all (m + 1): d(sum y)/dw = m + 1 per element, averaged over members.
  Tensor x = full({1, 3}, static_cast<float>(pg->rank() + 1), kF32);
  ddp(x).sum().backward();
  float want = 0;
  for (const int m : ends(pg->size())) want += static_cast<float>(m + 1);
  want /= static_cast<float>(group->size());
  expect_close(model->weight.grad(), full({1, 3}, want), 1e-6, 1e-6);
  pg->barrier()->wait();
}

#if EMBER_WITH_CUDA
// NCCL's subgroups come from ncclCommSplit; in a world of one (more ranks need a GPU each)
// the split's one member all-reduces and broadcasts on its own.
TEST(Subgroup, NcclSplitOfAWorldOfOne) {
  EMBER_REQUIRE_CUDA();
  auto pg = std::make_shared<NcclProcessGroup>(0, 1, 0, 0, NcclProcessGroup::create_unique_id());
  auto group = pg->new_group({0});
  EXPECT_EQ(group->backend(), "nccl");
  EXPECT_EQ(group->rank(), 0);
  EXPECT_EQ(group->tensor_device(), cuda_device(0));
  Tensor t = full({8}, 3.0f, TensorOptions(kF32, cuda_device(0)));
  group->allreduce(t)->wait();
  group->broadcast(t, 0)->wait();
  expect_close(t.to(kCPU), full({8}, 3.0f), 0, 0);
  EXPECT_EMBER_ERROR(group->allreduce(ones({2})), "the NCCL group works on cuda:0");
}
#endif

}  // namespace
}  // namespace ember::dist
