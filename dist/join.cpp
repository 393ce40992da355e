#include "join.h"

#include <algorithm>
#include <cstdio>
#include <exception>

#include <ember/tensor/grad_mode.h>

#include "ddp.h"
#include "sync_batch_norm.h"
#include "zero.h"

namespace ember::dist {

namespace detail {

namespace {

constexpr const char* kOp = "Join";

// One announcement: what a rank still training is about to issue. A rank that joined
// sends zeros (active 0).
enum Field { kActive, kOpField, kDType, kNumel, kRoot, kReduce, kJoinable, kFields };

std::string ranks_str(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

std::vector<int> ranks_where(const std::vector<std::vector<int64_t>>& all, bool active) {
  std::vector<int> out;
  for (size_t r = 0; r < all.size(); ++r) {
    if ((all[r][kActive] != 0) == active) out.push_back(static_cast<int>(r));
  }
  return out;
}

std::string describe_row(const std::vector<int64_t>& row) {
  static const char* const names[] = {"none",      "DDP forward",    "all-reduce", "all-gather",
                                      "broadcast", "bucket rebuild", "ZeRO step"};
  const int64_t op = row[kOpField];
  std::string s = op >= 0 && op <= 6 ? names[op] : "unknown operation " + std::to_string(op);
  if (op == 2 || op == 3 || op == 4) {
    s += ::ember::detail::str_cat(" of ", row[kNumel], " ",
                                  row[kDType] >= 0 && row[kDType] < kNumDTypes
                                      ? ::ember::detail::str_cat(static_cast<DType>(row[kDType]))
                                      : std::to_string(row[kDType]));
  }
  if (op == 4) s += " from rank " + std::to_string(row[kRoot]);
  return s;
}

// The row the active ranks agree on; ember::Error naming them when they do not.
const std::vector<int64_t>& agreed_row(const std::vector<std::vector<int64_t>>& all,
                                       const std::vector<int>& active, int rank) {
  const auto& first = all[static_cast<size_t>(active.front())];
  for (int r : active) {
    const auto& row = all[static_cast<size_t>(r)];
    EMBER_CHECK(row == first, kOp, "the ranks still training issue different collectives: rank ",
                active.front(), " a ", describe_row(first), ", rank ", r, " a ", describe_row(row),
                " (seen on rank ", rank,
                "); every rank must run the same model code, and inside a Join only "
                "DistributedDataParallel and SyncBatchNorm may communicate");
  }
  return first;
}

}  // namespace

JoinChannel::JoinChannel(std::shared_ptr<ProcessGroup> group, JoinOptions options)
    : group_(std::move(group)), options_(options) {}

std::vector<int64_t> JoinChannel::describe(Op op, const Tensor& tensor, int root, ReduceOp reduce,
                                           int joinable) const {
  std::vector<int64_t> row(kFields, 0);
  row[kActive] = 1;
  row[kOpField] = static_cast<int64_t>(op);
  if (tensor.defined()) {
    row[kDType] = static_cast<int64_t>(tensor.dtype());
    row[kNumel] = tensor.numel();
  }
  row[kRoot] = root;
  row[kReduce] = static_cast<int64_t>(reduce);
  row[kJoinable] = joinable;
  return row;
}

std::vector<std::vector<int64_t>> JoinChannel::exchange(const std::vector<int64_t>& mine) {
  NoGradGuard no_grad;
  const auto n = static_cast<int64_t>(mine.size());
  const Device where = group_->tensor_device();
  const Tensor input = from_vector<int64_t>(mine, {n}).to(where);
  std::vector<Tensor> outputs;
  for (int r = 0; r < group_->size(); ++r) outputs.push_back(empty({n}, input.options()));
  group_->allgather(outputs, input)->wait();
  std::vector<std::vector<int64_t>> all;
  for (const Tensor& t : outputs) all.push_back(t.to(kCPU).to_vector<int64_t>());
  return all;
}

void JoinChannel::wait_pending() {
  // Each wait either succeeds or throws: the announcements are long done by now.
  std::vector<Pending> pending = std::move(pending_);
  pending_.clear();
  for (Pending& p : pending) p.work->wait();
}

void JoinChannel::check_termination(const std::vector<std::vector<int64_t>>& all) {
  if (!options_.throw_on_early_termination) return;
  const std::vector<int> joined = ranks_where(all, false);
  if (joined.empty()) return;
  terminated_ = true;
  state_ = State::kDone;
  throw Error(::ember::detail::str_cat(
      kOp, ": rank(s) ", ranks_str(joined), " ran out of inputs while rank ", group_->rank(),
      " still trains; with throw_on_early_termination every rank throws"));
}

JoinChannel::ForwardInfo JoinChannel::announce_forward(int joinable) {
  return announce_and_wait(Op::kForward, joinable);
}

JoinChannel::ForwardInfo JoinChannel::announce_and_wait(Op op, int joinable) {
  wait_pending();
  const auto all = exchange(describe(op, Tensor(), 0, ReduceOp::kSum, joinable));
  check_termination(all);
  std::vector<int> active = ranks_where(all, true);
  agreed_row(all, active, group_->rank());
  return {static_cast<int>(active.size()), active.back(), std::move(active)};
}

void JoinChannel::announce(Op op, const Tensor& tensor, int root, ReduceOp reduce, int joinable) {
  EMBER_CHECK(op != Op::kAllreduce || reduce == ReduceOp::kSum || reduce == ReduceOp::kAvg, kOp,
              "only sum and average all-reduces can be shadowed with zeros");
  const std::vector<int64_t> row = describe(op, tensor, root, reduce, joinable);
  if (options_.throw_on_early_termination) {
    const auto all = exchange(row);
    check_termination(all);
    return;
  }
  // Not waited for: the active ranks go straight on to the collective itself. The handles
  // are kept until the next DDP forward; without DDP, at most 64 (long done by then).
  if (pending_.size() >= 64) wait_pending();
  NoGradGuard no_grad;
  Pending p;
  p.input = from_vector<int64_t>(row, {kFields}).to(group_->tensor_device());
  for (int r = 0; r < group_->size(); ++r) p.outputs.push_back(empty({kFields}, p.input.options()));
  p.work = group_->allgather(p.outputs, p.input);
  pending_.push_back(std::move(p));
}

}  // namespace detail

Join::Join(std::vector<std::shared_ptr<nn::Module>> joinables, JoinOptions options)
    : Join(std::move(joinables), std::vector<ZeroRedundancyOptimizer*>{}, options) {}

Join::Join(std::vector<std::shared_ptr<nn::Module>> joinables,
           std::vector<ZeroRedundancyOptimizer*> optimizers, JoinOptions options)
    : joinables_(std::move(joinables)),
      zeros_(std::move(optimizers)),
      options_(options),
      uncaught_at_start_(std::uncaught_exceptions()) {
  EMBER_CHECK(!joinables_.empty(), "Join",
              "no modules given; pass the DistributedDataParallel (and any SyncBatchNorm "
              "model not inside it) to cover");
  for (size_t i = 0; i < joinables_.size(); ++i) {
    EMBER_CHECK(joinables_[i] != nullptr, "Join", "module ", i, " of ", joinables_.size(),
                " is null");
    for (auto& [path, m] : joinables_[i]->named_modules()) {
      if (auto* ddp = dynamic_cast<DistributedDataParallel*>(m)) {
        if (std::find(ddps_.begin(), ddps_.end(), ddp) == ddps_.end()) ddps_.push_back(ddp);
      } else if (auto* bn = dynamic_cast<SyncBatchNorm*>(m)) {
        if (std::find(sync_bns_.begin(), sync_bns_.end(), bn) == sync_bns_.end())
          sync_bns_.push_back(bn);
      }
    }
  }
  EMBER_CHECK(!ddps_.empty() || !sync_bns_.empty(), "Join", "none of the ", joinables_.size(),
              " modules is a DistributedDataParallel or holds a SyncBatchNorm: nothing to join");
  std::shared_ptr<ProcessGroup> group =
      ddps_.empty() ? sync_bns_.front()->group() : ddps_.front()->group_;
  for (size_t i = 0; i < ddps_.size(); ++i) {
    EMBER_CHECK(ddps_[i]->group_ == group, "Join", "DistributedDataParallel ", i,
                " uses another process group than DistributedDataParallel 0; one Join covers "
                "one group");
    EMBER_CHECK(ddps_[i]->join_ == nullptr, "Join", "DistributedDataParallel ", i,
                " is already covered by another live Join");
  }
  for (size_t i = 0; i < sync_bns_.size(); ++i) {
    EMBER_CHECK(sync_bns_[i]->group() == group, "Join", "SyncBatchNorm ", i, " (", sync_bns_.size(),
                " found) uses another process group than the ",
                ddps_.empty() ? "first SyncBatchNorm" : "DistributedDataParallel",
                "; one Join covers one group (SyncBatchNorm over a subgroup cannot be joined)");
    EMBER_CHECK(sync_bns_[i]->join_ == nullptr, "Join", "SyncBatchNorm ", i,
                " is already covered by another live Join");
  }
  for (size_t i = 0; i < zeros_.size(); ++i) {
    EMBER_CHECK(zeros_[i] != nullptr, "Join", "ZeroRedundancyOptimizer ", i, " is null");
    EMBER_CHECK(&zeros_[i]->group() == group.get(), "Join", "ZeroRedundancyOptimizer ", i,
                " uses another process group than the modules; one Join covers one group");
    EMBER_CHECK(!zeros_[i]->shards_gradients(), "Join", "ZeroRedundancyOptimizer ", i,
                " shards the gradients (ZeRO-2), which a Join cannot shadow");
    EMBER_CHECK(!zeros_[i]->join_, "Join", "ZeroRedundancyOptimizer ", i,
                " is already covered by another live Join");
  }
  channel_ = std::make_shared<detail::JoinChannel>(group, options_);
  if (!options_.enable) return;
  for (size_t i = 0; i < ddps_.size(); ++i) ddps_[i]->set_join(channel_, static_cast<int>(i));
  for (SyncBatchNorm* bn : sync_bns_) bn->join_ = channel_;
  for (size_t i = 0; i < zeros_.size(); ++i) zeros_[i]->set_join(channel_, static_cast<int>(i));
}

Join::~Join() {
  const bool pending_join = options_.enable && !joined_ && !failed_ && !channel_->terminated_;
  if (pending_join && std::uncaught_exceptions() <= uncaught_at_start_) {
    try {
      join();
    } catch (const std::exception& e) {
      std::fprintf(stderr,
                   "ember: dist::Join on rank %d: joining when the Join went out of scope "
                   "failed (call join() explicitly to handle errors): %s\n",
                   channel_->group().rank(), e.what());
      std::terminate();
    }
  }
  release();
}

void Join::release() {
  if (released_ || !options_.enable) return;
  released_ = true;
  channel_->state_ = detail::JoinChannel::State::kDone;
  for (DistributedDataParallel* ddp : ddps_) ddp->set_join(nullptr, -1);
  for (SyncBatchNorm* bn : sync_bns_) bn->join_ = nullptr;
  for (ZeroRedundancyOptimizer* zero : zeros_) zero->set_join(nullptr, -1);
}

void Join::join() {
  if (joined_) return;
  if (!options_.enable || channel_->terminated_) {  // nothing to shadow
    joined_ = true;
    release();
    return;
  }
  EMBER_CHECK(!failed_, "Join::join", "an earlier join() on rank ", channel_->group().rank(),
              " failed; the ranks are no longer in step");
  detail::JoinChannel& ch = *channel_;
  ProcessGroup& pg = ch.group();
  try {
    ch.wait_pending();
    ch.state_ = detail::JoinChannel::State::kShadowing;
    NoGradGuard no_grad;
    const Device where = pg.tensor_device();
    const std::vector<int64_t> idle(detail::kFields, 0);
    while (true) {
      const auto all = ch.exchange(idle);
      const std::vector<int> active = detail::ranks_where(all, true);
      if (active.empty()) break;  // every rank has joined
      const auto& row = detail::agreed_row(all, active, pg.rank());
      if (options_.throw_on_early_termination) {
        ch.terminated_ = true;
        throw Error(
            ::ember::detail::str_cat("Join: rank ", pg.rank(), " ran out of inputs while rank(s) ",
                                     detail::ranks_str(active),
                                     " still train; with throw_on_early_termination every rank "
                                     "throws"));
      }
      ++shadowed_rounds_;
      using Op = detail::JoinChannel::Op;
      const auto op = static_cast<Op>(row[detail::kOpField]);
      auto scratch = [&] {
        return zeros({row[detail::kNumel]},
                     TensorOptions(static_cast<DType>(row[detail::kDType]), where));
      };
      switch (op) {
        case Op::kForward:
          break;  // the count itself was the collective
        case Op::kAllreduce: {
          // A DDP bucket is shadowed in the bucket itself, so that this rank holds the active
          // ranks' average there (a ZeroRedundancyOptimizer steps its shard with it).
          const int64_t index = row[detail::kJoinable];
          const auto reduce = static_cast<ReduceOp>(row[detail::kReduce]);
          if (index >= 0 && index < static_cast<int64_t>(ddps_.size())) {
            ddps_[static_cast<size_t>(index)]->join_shadow_bucket(
                static_cast<size_t>(row[detail::kRoot]), row[detail::kNumel], reduce);
          } else {
            pg.allreduce(scratch(), reduce)->wait();
          }
          break;
        }
        case Op::kZeroStep: {
          const int64_t index = row[detail::kJoinable];
          EMBER_CHECK(index >= 0 && index < static_cast<int64_t>(zeros_.size()), "Join", "rank ",
                      active.front(), " steps its ZeroRedundancyOptimizer ", index, " but rank ",
                      pg.rank(), "'s Join covers ", zeros_.size());
          zeros_[static_cast<size_t>(index)]->join_step(active);
          break;
        }
        case Op::kAllgather: {
          const Tensor mine = scratch();
          std::vector<Tensor> outputs;
          for (int r = 0; r < pg.size(); ++r)
            outputs.push_back(empty(mine.sizes(), mine.options()));
          pg.allgather(outputs, mine)->wait();
          break;
        }
        case Op::kBroadcast:
          pg.broadcast(scratch(), static_cast<int>(row[detail::kRoot]))->wait();
          break;
        case Op::kRebuildBuckets: {
          const int64_t index = row[detail::kJoinable];
          EMBER_CHECK(index >= 0 && index < static_cast<int64_t>(ddps_.size()), "Join", "rank ",
                      active.front(), " rebuilds the buckets of its DistributedDataParallel ",
                      index, " but rank ", pg.rank(), "'s Join covers ", ddps_.size());
          ddps_[static_cast<size_t>(index)]->join_rebuild_buckets();
          break;
        }
        default:
          throw Error(::ember::detail::str_cat("Join: rank ", active.front(), " announced ",
                                               detail::describe_row(row), ", which rank ",
                                               pg.rank(), " cannot shadow"));
      }
    }
    // Every rank has joined: the models are made equal from the highest-ranked of the last
    // ranks to join (they ran the most iterations).
    const auto last = ch.exchange({shadowed_rounds_ == 0 ? 1 : 0});
    const int root = detail::ranks_where(last, true).back();
    for (DistributedDataParallel* ddp : ddps_) ddp->join_sync_final_model(root);
  } catch (...) {
    failed_ = true;
    release();
    throw;
  }
  joined_ = true;
  release();
}

}  // namespace ember::dist
