// dist::Join (uneven inputs) at whatever world size the suite runs (1, 2 or 3 ranks): rank r
// has its own number of batches, so ranks run out at different steps. Each rank computes in
// one process, in f64, what PyTorch's Join defines (active ranks' gradient sum over the
// initial world size or over the active count, buffers from the highest active rank, the
// final model from the last rank to join) and checks every step against it.
#include <algorithm>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include <ember/data/dataloader.h>
#include <ember/dist/ddp.h>
#include <ember/dist/distributed_sampler.h>
#include <ember/dist/join.h>
#include <ember/dist/sync_batch_norm.h>
#include <ember/optim/sgd.h>

#include "dist_test_util.h"

namespace ember::dist {
namespace {

using ::ember::testing::expect_close;
using nn::NamedTensors;
using testing::CountingGroup;

// A broken join fails after 20 s instead of hanging.
std::shared_ptr<ProcessGroup> join_world() {
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(20);
  return testing::make_group(options);
}

std::shared_ptr<nn::Module> mlp(bool batch_norm) {
  manual_seed(5);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Linear>(4, 8));
  if (batch_norm) net->push_back(std::make_shared<nn::BatchNorm1d>(8));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Linear>(8, 3));
  net->to(kF64);
  return net;
}

// Rank `rank`'s batch number `step` (every rank can make every rank's batches).
std::pair<Tensor, Tensor> batch(int rank, int step, int64_t rows = 4) {
  Generator gen(static_cast<uint64_t>(1000 + 100 * rank + step));
  Tensor x = randn({rows, 4}, kF64, &gen);
  Tensor y = randint(0, 3, {rows}, kI64, &gen);
  return {x, y};
}

// How many batches rank r has. The layout: 5 and 3 (and 1 for a third rank); the
// highest active rank, which buffers come from, changes as ranks join.
using Layout = int (*)(int rank);
int fewer_on_higher_ranks(int rank) { return 5 - 2 * rank; }
// 1 and 3 (and 5): rank 0 runs out after its first step, before DDP rebuilds its buckets,
// so the ranks still training rebuild them from a rank that has joined (a broadcast from
// rank 0), and rank 0's buffers are stale while the others train.
int batches_of(int rank) { return 1 + 2 * rank; }

std::vector<int> active_at(int step, int world, Layout count) {
  std::vector<int> active;
  for (int r = 0; r < world; ++r) {
    if (count(r) > step) active.push_back(r);
  }
  return active;
}

int longest(int world, Layout count) {
  int most = 0;
  for (int r = 0; r < world; ++r) most = std::max(most, count(r));
  return most;
}

optim::SGDOptions sgd_options() {
  optim::SGDOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  return o;
}

// Small buckets: several all-reduces per step, reordered by the rebuild.
DDPOptions small_buckets() {
  DDPOptions o;
  o.first_bucket_cap_bytes = 64;
  o.bucket_cap_bytes = 256;
  return o;
}

NamedTensors clone_state(const nn::Module& m) {
  NamedTensors out;
  for (auto& [name, t] : m.state_dict()) out.emplace_back(name, t.detach().clone());
  return out;
}

void expect_state(const nn::Module& actual, const NamedTensors& expected) {
  const auto a = actual.state_dict();
  ASSERT_EQ(a.size(), expected.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].first);
    ASSERT_EQ(a[i].first, expected[i].first);
    expect_close(a[i].second.detach(), expected[i].second, 1e-9, 1e-12);
  }
}

// Parameters only (each rank's BatchNorm buffers hold its own last update).
void expect_params(const nn::Module& actual, const NamedTensors& expected) {
  for (auto& [name, p] : actual.named_parameters()) {
    SCOPED_TRACE(name);
    auto it = std::find_if(expected.begin(), expected.end(),
                           [&name = name](const auto& e) { return e.first == name; });
    ASSERT_NE(it, expected.end());
    expect_close(p.detach(), it->second, 1e-9, 1e-12);
  }
}

void expect_grads(const nn::Module& m, const std::vector<Tensor>& expected) {
  const auto params = m.named_parameters();
  ASSERT_EQ(params.size(), expected.size());
  for (size_t i = 0; i < params.size(); ++i) {
    SCOPED_TRACE(params[i].first);
    expect_close(params[i].second.grad(), expected[i], 1e-9, 1e-12);
  }
}

// What every step should give: the averaged gradient and the state after the step.
struct Trajectory {
  std::vector<std::vector<Tensor>> grads;
  std::vector<NamedTensors> states;
};

// Sets the reference's gradients to sum / divisor, records them, steps.
void record_step(nn::Module& model, optim::SGD& sgd, std::vector<Tensor> sum, double divisor,
                 Trajectory& t) {
  std::vector<Tensor> grads;
  const auto params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    grads.push_back(sum[i] / divisor);
    params[i].set_grad(grads.back().clone());
  }
  t.grads.push_back(grads);
  sgd.step();
  t.states.push_back(clone_state(model));
}

void accumulate(std::vector<Tensor>& sum, const nn::Module& model) {
  const auto params = model.parameters();
  if (sum.empty()) {
    for (const Tensor& p : params) sum.push_back(zeros(p.sizes(), p.options()));
  }
  for (size_t i = 0; i < params.size(); ++i) sum[i] = sum[i] + params[i].grad().detach();
}

// DDP with per-rank BatchNorm under Join, in one process: at step s the ranks with more
// than s batches each take the gradient of their own batch (their own BatchNorm batch
// statistics). Each rank keeps its own buffers; every forward first copies those of the
// highest active rank to all (so when that rank joins, the next one's own buffers win).
Trajectory reference_ddp(int world, bool by_initial_world_size, Layout count) {
  auto model = mlp(true);
  optim::SGD sgd(model->parameters(), sgd_options());
  auto buffers_of_model = [&] {
    NamedTensors b;
    for (auto& [name, v] : model->named_buffers()) b.emplace_back(name, v.clone());
    return b;
  };
  std::vector<NamedTensors> buffers(static_cast<size_t>(world), buffers_of_model());
  Trajectory t;
  for (int step = 0; step < longest(world, count); ++step) {
    const std::vector<int> active = active_at(step, world, count);
    const NamedTensors synced = buffers[static_cast<size_t>(active.back())];
    std::vector<Tensor> sum;
    for (int r : active) {  // ascending: the model ends with the highest active rank's buffers
      {
        NoGradGuard no_grad;
        const auto mine = model->named_buffers();
        for (size_t i = 0; i < mine.size(); ++i) Tensor(mine[i].second).copy_(synced[i].second);
      }
      model->zero_grad();
      auto [x, y] = batch(r, step);
      cross_entropy((*model)(x), y).backward();
      accumulate(sum, *model);
      buffers[static_cast<size_t>(r)] = buffers_of_model();
    }
    record_step(*model, sgd, sum,
                by_initial_world_size ? world : static_cast<double>(active.size()), t);
  }
  return t;
}

TEST(Join, UnevenBatchesFollowPyTorchsJoinUnderBothDivisors) {
  auto pg = join_world();
  const int rank = pg->rank(), world = pg->size();
  for (auto [count, by_initial] : {std::pair<Layout, bool>{fewer_on_higher_ranks, true},
                                   {fewer_on_higher_ranks, false},
                                   {batches_of, true},
                                   {batches_of, false}}) {
    SCOPED_TRACE(by_initial ? "divide_by_initial_world_size" : "divide by active ranks");
    SCOPED_TRACE(::testing::Message() << "rank 0 has " << count(0) << " batches");
    const Trajectory expected = reference_ddp(world, by_initial, count);
    const int last = count == fewer_on_higher_ranks ? 0 : world - 1;  // the most batches
    auto ddp = std::make_shared<DistributedDataParallel>(mlp(true), pg, small_buckets());
    optim::SGD sgd(ddp->parameters(), sgd_options());
    {
      Join join({ddp}, {.divide_by_initial_world_size = by_initial});
      for (int step = 0; step < count(rank); ++step) {
        SCOPED_TRACE(::testing::Message() << "step " << step);
        auto [x, y] = batch(rank, step);
        sgd.zero_grad();
        cross_entropy((*ddp)(x), y).backward();
        expect_grads(ddp->module(), expected.grads[static_cast<size_t>(step)]);
        sgd.step();
        expect_params(ddp->module(), expected.states[static_cast<size_t>(step)]);
      }
      join.join();
      EXPECT_TRUE(join.joined());
      EXPECT_EQ(join.is_last_joiner(), rank == last);
      EXPECT_EQ(join.shadowed_rounds() > 0, rank != last);
    }
    // Every rank ends with the last joiner's model, buffers included.
    expect_state(ddp->module(), expected.states.back());
    EXPECT_EQ(ddp->buckets_rebuilt(), longest(world, count) > 1);

    // After the Join, plain DDP again: an even step averages every rank's gradient.
    auto reference = mlp(true);
    reference->load_state_dict(expected.states.back());
    std::vector<Tensor> sum;
    for (int r = 0; r < world; ++r) {
      reference->load_state_dict(expected.states.back());  // rank 0's buffers win
      reference->zero_grad();
      auto [x, y] = batch(r, 50);
      cross_entropy((*reference)(x), y).backward();
      accumulate(sum, *reference);
    }
    for (Tensor& s : sum) s = s / static_cast<double>(world);
    auto [x, y] = batch(rank, 50);
    sgd.zero_grad();
    cross_entropy((*ddp)(x), y).backward();
    expect_grads(ddp->module(), sum);
  }
}

Tensor golden_tensor(const nlohmann::json& j) {
  const auto data = j["data"].get<std::vector<double>>();
  return from_vector<double>(data, {static_cast<int64_t>(data.size())})
      .reshape(j["shape"].get<Shape>());  // num_batches_tracked is 0-dim
}

NamedTensors golden_state(const nlohmann::json& j) {
  NamedTensors out;
  for (auto& [name, t] : j.items()) out.emplace_back(name, golden_tensor(t));
  return out;
}

// PyTorch 1.13's DDP under Join over gloo, 2 ranks with 5 and 3 batches (written by
// golden/make_join_golden.py): the same gradients at every step and the same final model on
// both ranks, under both divisors.
TEST(Join, MatchesPyTorchOnFiveAndThreeBatches) {
  auto pg = join_world();
  if (pg->size() != 2) GTEST_SKIP() << "PyTorch's values are for 2 ranks";
  const int rank = pg->rank();
  std::ifstream in(EMBER_JOIN_GOLDEN);
  ASSERT_TRUE(in.good()) << "cannot open " << EMBER_JOIN_GOLDEN;
  const nlohmann::json golden = nlohmann::json::parse(in);
  const NamedTensors initial = golden_state(golden["initial"]);
  const auto& batches = golden["batches"][static_cast<size_t>(rank)];
  for (const auto& c : golden["cases"]) {
    const bool by_initial = c["divide_by_initial_world_size"].get<bool>();
    SCOPED_TRACE(by_initial ? "divide_by_initial_world_size" : "divide by active ranks");
    auto model = mlp(true);
    model->load_state_dict(initial);  // strict: PyTorch's names and shapes
    auto ddp = std::make_shared<DistributedDataParallel>(model, pg);
    optim::SGD sgd(ddp->parameters(), sgd_options());
    const auto& grads = c["grads"][static_cast<size_t>(rank)];
    ASSERT_EQ(grads.size(), batches.size());
    {
      Join join({ddp}, {.divide_by_initial_world_size = by_initial});
      for (size_t step = 0; step < batches.size(); ++step) {
        SCOPED_TRACE(::testing::Message() << "step " << step);
        const Tensor x = golden_tensor(batches[step]["x"]);
        const auto labels = batches[step]["y"].get<std::vector<int64_t>>();
        const Tensor y = from_vector<int64_t>(labels, {static_cast<int64_t>(labels.size())});
        sgd.zero_grad();
        cross_entropy((*ddp)(x), y).backward();
        for (auto& [name, p] : ddp->module().named_parameters()) {
          SCOPED_TRACE(name);
          expect_close(p.grad(), golden_tensor(grads[step][name]), 1e-9, 1e-12);
        }
        sgd.step();
      }
      join.join();
    }
    const NamedTensors final_state = golden_state(c["final"][static_cast<size_t>(rank)]);
    for (auto& [name, t] : ddp->module().state_dict()) {
      SCOPED_TRACE(name);
      auto it = std::find_if(final_state.begin(), final_state.end(),
                             [&name = name](const auto& e) { return e.first == name; });
      ASSERT_NE(it, final_state.end());
      expect_close(t.detach().to(kF64), it->second, 1e-9, 1e-12);
    }
  }
}

// SyncBatchNorm inside the DDP model, batches of 3 + rank rows: the statistics cover the
// active ranks' rows only; the gradients are those of one process that runs the model on
// the active ranks' batches concatenated, with the loss sum / divisor.
TEST(Join, SyncBatchNormUsesTheActiveRanksBatchesOnly) {
  auto pg = join_world();
  const int rank = pg->rank(), world = pg->size();
  auto rows = [](int r) { return int64_t{3} + r; };
  for (bool by_initial : {true, false}) {
    SCOPED_TRACE(by_initial ? "divide_by_initial_world_size" : "divide by active ranks");
    Trajectory expected;
    {
      auto model = mlp(true);
      optim::SGD sgd(model->parameters(), sgd_options());
      for (int step = 0; step < longest(world, fewer_on_higher_ranks); ++step) {
        const std::vector<int> active = active_at(step, world, fewer_on_higher_ranks);
        std::vector<Tensor> xs, ys;
        for (int r : active) {
          auto [x, y] = batch(r, step, rows(r));
          xs.push_back(x);
          ys.push_back(y);
        }
        model->zero_grad();
        const Tensor out = (*model)(cat(xs));
        Tensor loss = zeros({}, TensorOptions(kF64, kCPU));
        int64_t at = 0;
        for (size_t i = 0; i < ys.size(); ++i) {
          loss = loss + cross_entropy(out.narrow(0, at, ys[i].size(0)), ys[i]);
          at += ys[i].size(0);
        }
        const double divisor = by_initial ? world : static_cast<double>(active.size());
        (loss / divisor).backward();
        std::vector<Tensor> grads;
        for (const Tensor& p : model->parameters()) grads.push_back(p.grad().clone());
        record_step(*model, sgd, grads, 1.0, expected);
      }
    }
    auto ddp = std::make_shared<DistributedDataParallel>(convert_sync_batchnorm(mlp(true), pg), pg);
    optim::SGD sgd(ddp->parameters(), sgd_options());
    {
      Join join({ddp}, {.divide_by_initial_world_size = by_initial});
      for (int step = 0; step < fewer_on_higher_ranks(rank); ++step) {
        SCOPED_TRACE(::testing::Message() << "step " << step);
        auto [x, y] = batch(rank, step, rows(rank));
        sgd.zero_grad();
        cross_entropy((*ddp)(x), y).backward();
        expect_grads(ddp->module(), expected.grads[static_cast<size_t>(step)]);
        sgd.step();
        // Running statistics included: those of the active ranks' rows.
        expect_state(ddp->module(), expected.states[static_cast<size_t>(step)]);
      }
      join.join();
    }
    expect_state(ddp->module(), expected.states.back());
  }
}

// A SyncBatchNorm model without DDP can be joined on its own: the joined ranks take part
// in the statistics with an empty batch.
TEST(Join, SyncBatchNormAloneIsShadowed) {
  auto pg = join_world();
  const int rank = pg->rank(), world = pg->size();
  auto holder = std::make_shared<nn::Sequential>();
  auto bn = std::make_shared<SyncBatchNorm>(2, pg);
  holder->push_back(bn);
  nn::BatchNorm1d reference(2);
  {
    Join join({holder});
    for (int step = 0; step < batches_of(rank); ++step) {
      Generator gen(static_cast<uint64_t>(7 + 10 * rank + step));
      Tensor x = randn({3, 2}, kF32, &gen).requires_grad_();
      (*holder)(x).sum().backward();
    }
    join.join();
  }
  for (int step = 0; step < batches_of(rank); ++step) {  // the steps this rank saw
    std::vector<Tensor> xs;
    for (int r : active_at(step, world, batches_of)) {
      Generator gen(static_cast<uint64_t>(7 + 10 * r + step));
      xs.push_back(randn({3, 2}, kF32, &gen));
    }
    reference(cat(xs));
  }
  // The statistics of the ranks still running at each step.
  expect_close(bn->running_mean, reference.running_mean, 1e-5, 1e-6);
  expect_close(bn->running_var, reference.running_var, 1e-5, 1e-6);
}

// Rank r has 3 + 2r micro-batches, accumulated in pairs (no_sync on the first). A rank
// that runs out in the middle of a pair has stepped on its last complete pair; its odd
// micro-batch's gradient is never communicated (as in PyTorch). The others' synced pairs
// are shadowed with zeros. The Join ends in its destructor here.
TEST(Join, AccumulationWithNoSyncAcrossAJoin) {
  auto pg = join_world();
  const int rank = pg->rank(), world = pg->size();
  auto micro_batches = [](int r) { return 3 + 2 * r; };
  for (bool by_initial : {true, false}) {
    SCOPED_TRACE(by_initial ? "divide_by_initial_world_size" : "divide by active ranks");
    Trajectory expected;
    {
      auto model = mlp(false);
      optim::SGD sgd(model->parameters(), sgd_options());
      for (int step = 0; step < micro_batches(world - 1) / 2; ++step) {
        std::vector<Tensor> sum;
        int active = 0;
        for (int r = 0; r < world; ++r) {
          if (micro_batches(r) < 2 * step + 2) continue;
          ++active;
          model->zero_grad();
          for (int i : {2 * step, 2 * step + 1}) {
            auto [x, y] = batch(r, i);
            (cross_entropy((*model)(x), y) * 0.5).backward();
          }
          accumulate(sum, *model);
        }
        record_step(*model, sgd, sum, by_initial ? world : static_cast<double>(active), expected);
      }
    }
    auto ddp = std::make_shared<DistributedDataParallel>(mlp(false), pg, small_buckets());
    optim::SGD sgd(ddp->parameters(), sgd_options());
    {
      Join join({ddp}, {.divide_by_initial_world_size = by_initial});
      for (int i = 0; i < micro_batches(rank); ++i) {
        SCOPED_TRACE(::testing::Message() << "micro-batch " << i);
        auto [x, y] = batch(rank, i);
        if (i % 2 == 0) {
          sgd.zero_grad();
          auto no_sync = ddp->no_sync();
          (cross_entropy((*ddp)(x), y) * 0.5).backward();
          continue;
        }
        (cross_entropy((*ddp)(x), y) * 0.5).backward();
        expect_grads(ddp->module(), expected.grads[static_cast<size_t>(i / 2)]);
        sgd.step();
      }
    }  // no join(): the destructor joins
    expect_state(ddp->module(), expected.states.back());
  }
}

// With enable = false the Join does nothing: the same collectives as plain DDP (even
// inputs), and join() returns at once. Enabled, each step costs announcements.
TEST(Join, DisabledIsPlainDdp) {
  auto pg = join_world();
  const int rank = pg->rank(), world = pg->size();
  auto run = [&](std::optional<bool> enable) {
    auto counting = std::make_shared<CountingGroup>(pg);
    auto ddp = std::make_shared<DistributedDataParallel>(mlp(false), counting);
    std::optional<Join> join;
    if (enable) join.emplace(std::vector<std::shared_ptr<nn::Module>>{ddp}, JoinOptions{*enable});
    const int before = counting->calls;
    for (int step = 0; step < 3; ++step) {
      auto [x, y] = batch(rank, step);
      ddp->zero_grad();
      cross_entropy((*ddp)(x), y).backward();
    }
    if (join) join->join();
    std::vector<Tensor> grads;
    for (const Tensor& p : ddp->parameters()) grads.push_back(p.grad().clone());
    return std::pair{counting->calls - before, grads};
  };
  const auto [plain_calls, plain_grads] = run(std::nullopt);
  const auto [disabled_calls, disabled_grads] = run(false);
  const auto [enabled_calls, enabled_grads] = run(true);
  EXPECT_EQ(disabled_calls, plain_calls);
  EXPECT_GT(enabled_calls, plain_calls);
  for (size_t i = 0; i < plain_grads.size(); ++i) {
    expect_close(disabled_grads[i], plain_grads[i], 1e-12, 1e-14);
    expect_close(enabled_grads[i], plain_grads[i], 1e-12, 1e-14);
  }
  // The last step's gradient: every rank's batch averaged.
  auto reference = mlp(false);
  std::vector<Tensor> sum;
  for (int r = 0; r < world; ++r) {
    reference->zero_grad();
    auto [x, y] = batch(r, 2);
    cross_entropy((*reference)(x), y).backward();
    accumulate(sum, *reference);
  }
  for (size_t i = 0; i < sum.size(); ++i)
    expect_close(plain_grads[i], sum[i] / static_cast<double>(world), 1e-9, 1e-12);
}

TEST(Join, ThrowOnEarlyTerminationThrowsOnEveryRank) {
  auto pg = join_world();
  const int rank = pg->rank(), world = pg->size();
  auto ddp = std::make_shared<DistributedDataParallel>(mlp(false), pg);
  std::string message;
  int steps = 0;
  try {
    Join join({ddp}, {.throw_on_early_termination = true});
    for (int step = 0; step < batches_of(rank); ++step) {
      auto [x, y] = batch(rank, step);
      ddp->zero_grad();
      cross_entropy((*ddp)(x), y).backward();
      ++steps;
    }
    join.join();
  } catch (const Error& e) {
    message = e.what();
  }
  if (world == 1) {
    EXPECT_EQ(message, "");
    return;
  }
  EXPECT_NE(message.find("ran out of inputs"), std::string::npos) << message;
  EXPECT_EQ(steps, batches_of(0));  // everyone stopped at the first rank's end
  // The ranks are still in step: the group works.
  Tensor one = ones({1});
  pg->allreduce(one)->wait();
  EXPECT_EQ(one.item<float>(), static_cast<float>(world));
}

// An exception leaving the Join's scope (here on every rank alike) makes the destructor
// communicate nothing, as PyTorch's __exit__; the DDP is released for the next Join.
TEST(Join, AnExceptionLeavingTheScopeCommunicatesNothing) {
  auto pg = join_world();
  auto counting = std::make_shared<CountingGroup>(pg);
  auto ddp = std::make_shared<DistributedDataParallel>(mlp(false), counting);
  int calls = -1;
  try {
    Join join({ddp});
    auto [x, y] = batch(pg->rank(), 0);
    cross_entropy((*ddp)(x), y).backward();
    calls = counting->calls;
    throw std::runtime_error("the user's loop failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(counting->calls, calls);
  Join again({ddp});
  auto [x, y] = batch(pg->rank(), 1);
  cross_entropy((*ddp)(x), y).backward();
  again.join();
  EXPECT_TRUE(again.is_last_joiner());  // all ran out together
}

TEST(Join, RefusesWhatItCannotCover) {
  auto pg = join_world();
  EXPECT_EMBER_ERROR(Join({}), "no modules given");
  EXPECT_EMBER_ERROR(Join({mlp(false)}), "nothing to join");
  EXPECT_EMBER_ERROR(Join({nullptr}), "is null");
  auto ddp = std::make_shared<DistributedDataParallel>(mlp(false), pg);
  Join join({ddp});
  EXPECT_EMBER_ERROR(Join({ddp}), "already covered by another live Join");
  join.join();
  Join again({ddp});  // a released DDP can be joined again (the next epoch)
  again.join();
  // SyncBatchNorm over another group (a subgroup, say) than its DDP's.
  auto other = join_world();
  auto mixed =
      std::make_shared<DistributedDataParallel>(convert_sync_batchnorm(mlp(true), other), pg);
  EXPECT_EMBER_ERROR(Join({mixed}), "one Join covers one group");
}

// As a user writes it: an epoch over a DataLoader whose DistributedSampler does not pad
// (4 world + 1 samples in batches of 2: rank 0 has one batch more). Every sample is seen
// once, every rank finishes, and all end with the same parameters.
TEST(Join, AnEpochOverAnUnpaddedSampler) {
  auto pg = join_world();
  const int64_t n = 4 * pg->size() + 1;
  Generator gen(4);
  auto data = std::make_shared<data::TensorDataset>(randn({n, 4}, kF64, &gen),
                                                    randint(0, 3, {n}, kI64, &gen));
  auto sampler =
      std::make_shared<DistributedSampler>(n, *pg, DistributedSamplerOptions{.pad = false});
  data::DataLoader loader(data, {.batch_size = 2, .sampler = sampler});
  auto ddp = std::make_shared<DistributedDataParallel>(mlp(false), pg);
  optim::SGD sgd(ddp->parameters(), sgd_options());
  int64_t seen = 0, steps = 0;
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    sampler->set_epoch(epoch);
    Join join({ddp});
    for (const data::Batch& b : loader) {
      sgd.zero_grad();
      cross_entropy((*ddp)(b.data), b.target).backward();
      sgd.step();
      seen += b.data.size(0);
      ++steps;
    }
    join.join();
    EXPECT_EQ(join.is_last_joiner(), pg->rank() == 0);
  }
  EXPECT_EQ(steps, pg->rank() == 0 ? 6 : 4);
  Tensor total = from_vector<int64_t>({seen}, {1});
  pg->allreduce(total)->wait();
  EXPECT_EQ(total.item<int64_t>(), 2 * n);
  for (const Tensor& p : ddp->parameters()) {
    std::vector<Tensor> all;
    for (int r = 0; r < pg->size(); ++r) all.push_back(empty(p.sizes(), p.options()));
    pg->allgather(all, p.detach().contiguous())->wait();
    for (const Tensor& theirs : all) expect_close(theirs, all[0], 0.0, 0.0);
  }
}

TEST(Join, UnpaddedSamplerGivesUnevenShards) {
  DistributedSamplerOptions o;
  o.shuffle = false;
  o.pad = false;
  using V = std::vector<int64_t>;
  std::vector<V> got;
  for (int r = 0; r < 3; ++r) {
    DistributedSampler s(10, 3, r, o);
    got.push_back(s.indices());
    EXPECT_EQ(s.num_samples(), static_cast<int64_t>(got.back().size()));
    EXPECT_EQ(s.total_size(), 10);
  }
  EXPECT_EQ(got, (std::vector<V>{{0, 3, 6, 9}, {1, 4, 7}, {2, 5, 8}}));
  EXPECT_EQ(DistributedSampler(2, 3, 2, o).indices(), V{});  // fewer samples than ranks
  // Shuffled: every index exactly once over the ranks.
  o.shuffle = true;
  o.seed = 3;
  V all;
  for (int r = 0; r < 4; ++r) {
    DistributedSampler s(13, 4, r, o);
    s.set_epoch(2);
    const V part = s.indices();
    EXPECT_EQ(static_cast<int64_t>(part.size()), r == 0 ? 4 : 3);
    all.insert(all.end(), part.begin(), part.end());
  }
  std::sort(all.begin(), all.end());
  V expected(13);
  for (int64_t i = 0; i < 13; ++i) expected[static_cast<size_t>(i)] = i;
  EXPECT_EQ(all, expected);
  // drop_last takes precedence: even shards.
  o.drop_last = true;
  EXPECT_EQ(DistributedSampler(13, 4, 0, o).num_samples(), 3);
}

}  // namespace
}  // namespace ember::dist
