#include "ddp.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_set>

#include <ember/autograd/engine.h>
#include <ember/autograd/node.h>
#include <ember/dist/flight_recorder.h>
#include <ember/tensor/grad_mode.h>
#include <ember/tensor/trace.h>

#include "detail/coalesced.h"
#include "detail/default_group.h"
#include "join.h"

namespace ember::dist {

namespace {

constexpr const char* kOp = "DistributedDataParallel";

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// A parameter's identity across ranks: its name, shape and dtype.
int64_t fingerprint(const std::string& name, const Tensor& t) {
  uint64_t h = 14695981039346656037ull;
  h = fnv1a(h, name.data(), name.size());
  for (int64_t s : t.sizes()) h = fnv1a(h, &s, sizeof(s));
  const auto dtype = static_cast<uint8_t>(t.dtype());
  h = fnv1a(h, &dtype, 1);
  return static_cast<int64_t>(h);
}

std::string describe(const std::string& name, const Tensor& t) {
  return ::ember::detail::str_cat("\"", name, "\" ", shape_str(t.sizes()), " ", t.dtype());
}

bool same_view(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.data_ptr() == b.data_ptr() && a.sizes() == b.sizes() &&
         a.strides() == b.strides() && a.dtype() == b.dtype();
}

std::vector<Tensor> gather(ProcessGroup& group, const Tensor& input) {
  std::vector<Tensor> outputs;
  for (int r = 0; r < group.size(); ++r) outputs.push_back(empty(input.sizes(), input.options()));
  group.allgather(outputs, input)->wait();
  return outputs;
}

// While a trace records: times each bucket's all-reduce on a thread of its own (the trace's
// "DDP all-reduce" row), which waits for it: on MPI and TCP that thread is the waiter that runs
// the collective when its turn comes; on NCCL, which orders streams instead of holding the
// host, it polls the Work. Collectives run in issue order, so one starts when it was issued or
// when the one before it ended, whichever is later. drain() returns once every issued bucket
// is recorded, so a step's buckets are in its trace before the step ends.
class BucketTimer {
 public:
  ~BucketTimer() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void watch(size_t bucket, int64_t bytes, WorkHandle work, bool host_waits) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back({bucket, bytes, trace::now_ns(), std::move(work), host_waits});
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    }
    cv_.notify_all();
  }
  void drain() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
  }

 private:
  struct Entry {
    size_t bucket;
    int64_t bytes, issued_ns;
    WorkHandle work;
    bool host_waits;
  };
  // Until `e` completes; false when the timer is being destroyed first.
  bool wait_for(const Entry& e) {
    if (e.host_waits) {
      try {
        e.work->wait();
      } catch (const std::exception&) {
        // The failure is the training thread's to report, from its own wait.
      }
      return true;
    }
    while (!e.work->is_completed()) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) return false;
    }
    return true;
  }
  void run() {
    trace::set_thread_row_name("DDP all-reduce");
    int64_t last_end = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Entry e = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      const bool done = wait_for(e);
      const int64_t end = trace::now_ns();
      if (done)
        trace::record(trace::Category::kComm,
                      "DDP bucket " + std::to_string(e.bucket) + " all_reduce",
                      std::max(e.issued_ns, last_end), end, e.bytes);
      last_end = end;
      e.work.reset();
      lock.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Entry> queue_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace

struct DistributedDataParallel::Reducer {
  struct Bucket {
    std::vector<size_t> params;  // indices into Reducer::params
    std::vector<int64_t> offsets;
    Tensor flat;  // every gradient of the bucket, contiguous
    Tensor wire;  // the compressed copy in flight
    size_t pending = 0;
    std::vector<WorkHandle> works;  // the bucket's collectives in flight
    // ZeRO-2: each rank's [offset, offset + numel) in flat (parameters grouped by owner),
    // and whether flat was released after the reduction, keeping this rank's gradients.
    std::vector<std::pair<int64_t, int64_t>> segments;
    bool compacted = false;
  };

  ProcessGroup* group;
  DDPOptions options;
  detail::JoinChannel* join = nullptr;  // the live Join's channel, if any
  int join_index = -1;
  int active_ranks = 0;  // ranks still training at the last forward (all without a Join)
  std::vector<std::string> names;
  std::vector<Tensor> params;
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of, slot_of;
  std::vector<char> ready;
  // ZeRO-2: the gradients the last reduction left on their owner (averages), by parameter.
  std::vector<Tensor> reduced;
  size_t next_bucket = 0;
  bool armed = false;  // a synced backward is expected: hooks count gradients
  bool warned_create_graph = false;
  std::weak_ptr<Reducer> self;  // for the callback that waits at the end of a backward pass
  bool any_ready = false;
  bool rebuilt = false;
  bool order_complete = false;  // the first synced iteration's gradient order is known
  std::vector<size_t> ready_order;
  BucketTimer timer;       // used while a trace records
  std::vector<int> owner;  // ZeRO-2: the rank owning each parameter's gradient (else empty)

  bool sharded() const { return !owner.empty(); }

  // ZeRO-2 releases a bucket's flat between reductions; a gradient arriving reallocates it.
  void ensure_flat(Bucket& b) {
    if (b.flat.defined()) return;
    int64_t elements = 0;
    for (size_t i : b.params) elements += params[i].numel();
    b.flat = zeros({elements}, params[b.params.front()].options());
  }

  Tensor view_of(size_t i) const {
    const Bucket& b = buckets[bucket_of[i]];
    const size_t slot = slot_of[i];
    return b.flat.narrow(0, b.offsets[slot], params[i].numel()).view(params[i].sizes());
  }

  // Packs parameters into buckets following `order`, keeping current gradient values.
  void build(const std::vector<size_t>& order) {
    NoGradGuard no_grad;
    struct Open {
      Bucket bucket;
      int64_t elements = 0;
      size_t closed = 0;
      size_t first_position = 0;
    };
    std::map<std::pair<int, std::string>, Open> open;
    std::vector<std::pair<size_t, Bucket>> done;  // (position of first param, bucket)
    std::vector<std::pair<size_t, int64_t>> sizes;
    auto close = [&](Open& o) {
      if (sharded()) group_by_owner(o.bucket);
      o.bucket.flat = zeros({o.elements}, params[o.bucket.params.front()].options());
      done.emplace_back(o.first_position, std::move(o.bucket));
      o.bucket = Bucket();
      o.elements = 0;
      ++o.closed;
    };
    for (size_t pos = 0; pos < order.size(); ++pos) {
      const Tensor& p = params[order[pos]];
      Open& o = open[{static_cast<int>(p.dtype()), p.device().str()}];
      if (o.bucket.params.empty()) o.first_position = pos;
      o.bucket.params.push_back(order[pos]);
      o.bucket.offsets.push_back(o.elements);
      o.elements += p.numel();
      const size_t cap = o.closed == 0 ? options.first_bucket_cap_bytes : options.bucket_cap_bytes;
      if (static_cast<size_t>(o.elements) * p.element_size() >= cap) close(o);
    }
    for (auto& [key, o] : open) {
      if (!o.bucket.params.empty()) close(o);
    }
    std::stable_sort(done.begin(), done.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<Tensor> old_grads;
    for (const Tensor& p : params) old_grads.push_back(p.grad());
    buckets.clear();
    for (auto& [pos, b] : done) buckets.push_back(std::move(b));
    bucket_of.assign(params.size(), 0);
    slot_of.assign(params.size(), 0);
    for (size_t b = 0; b < buckets.size(); ++b) {
      for (size_t s = 0; s < buckets[b].params.size(); ++s) {
        bucket_of[buckets[b].params[s]] = b;
        slot_of[buckets[b].params[s]] = s;
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (sharded() && !old_grads[i].defined()) continue;  // ZeRO-2 keeps absent ones absent
      Tensor view = view_of(i);
      if (old_grads[i].defined()) view.copy_(old_grads[i]);
      params[i].set_grad(view);
    }
  }

  // ZeRO-2: orders the bucket's parameters by owner (stably) and records each rank's segment.
  void group_by_owner(Bucket& b) const {
    std::stable_sort(b.params.begin(), b.params.end(),
                     [&](size_t x, size_t y) { return owner[x] < owner[y]; });
    b.segments.assign(static_cast<size_t>(group->size()), {0, 0});
    int64_t at = 0;
    for (size_t s = 0; s < b.params.size(); ++s) {
      b.offsets[s] = at;
      auto& [begin, numel] = b.segments[static_cast<size_t>(owner[b.params[s]])];
      if (numel == 0) begin = at;
      numel += params[b.params[s]].numel();
      at += params[b.params[s]].numel();
    }
  }

  // ZeRO-2, once the bucket's reductions completed: this rank's gradients move to a compact
  // copy, the others' are dropped, and flat is released.
  void compact(Bucket& b) {
    NoGradGuard no_grad;
    const auto [begin, numel] = b.segments[static_cast<size_t>(group->rank())];
    Tensor own;
    if (numel > 0) {
      own = empty({numel}, b.flat.options());
      own.copy_((b.wire.defined() ? b.wire : b.flat).narrow(0, begin, numel));
    }
    for (size_t s = 0; s < b.params.size(); ++s) {
      const size_t i = b.params[s];
      if (owner[i] == group->rank()) {
        params[i].set_grad(
            own.narrow(0, b.offsets[s] - begin, params[i].numel()).view(params[i].sizes()));
        reduced[i] = params[i].grad();
      } else {
        params[i].set_grad(Tensor());
        params[i].ensure_autograd_meta().grad_held_by_rank = owner[i];
      }
    }
    b.flat = Tensor();
    b.wire = Tensor();
    b.compacted = true;
  }

  // ZeRO-2, at each forward before anything moves the gradients: a gradient the last
  // reduction left on its owner and nobody cleared (a second backward without zero_grad) is the
  // ranks' average, held by the owner alone, while the next reduction averages every rank's
  // slot: it enters as the ranks' sum (world size times itself), as each rank's copy would
  // under DDP, so the result is its value plus the new average. Cleared or replaced gradients
  // are left alone.
  void scale_held_averages() {
    NoGradGuard no_grad;
    for (size_t i = 0; i < reduced.size(); ++i) {
      if (same_view(params[i].grad(), reduced[i]))
        Tensor(params[i].grad()).mul_(static_cast<double>(group->size()));
      reduced[i] = Tensor();
    }
  }

  // Makes every grad() a view into its bucket: a dropped gradient becomes zeros, one the
  // user replaced is copied in.
  void point_grads() {
    NoGradGuard no_grad;
    if (sharded()) {
      // ZeRO-2: only buckets holding a gradient are allocated; absent gradients stay absent.
      for (Bucket& b : buckets) {
        const bool any = std::any_of(b.params.begin(), b.params.end(),
                                     [&](size_t i) { return params[i].grad().defined(); });
        b.compacted = false;
        if (!any) {
          b.flat = Tensor();
          continue;
        }
        ensure_flat(b);
        for (size_t i : b.params) point_grad(i);
      }
      return;
    }
    for (size_t i = 0; i < params.size(); ++i) point_grad(i);
  }

  // Makes grad() a view into the bucket: a dropped gradient becomes zeros, one the user
  // replaced is copied in.
  void point_grad(size_t i) {
    const Tensor& g = params[i].grad();
    Tensor view = view_of(i);
    if (same_view(g, view)) return;
    if (g.defined()) {
      view.copy_(g);
    } else {
      view.zero_();
    }
    params[i].set_grad(view);
  }

  std::string unready_names() const {
    std::string s;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!ready[i]) s += (s.empty() ? "" : ", ") + names[i];
    }
    return s;
  }

  [[noreturn]] void throw_missing() {
    const std::string missing = unready_names();
    armed = false;
    throw Error(::ember::detail::str_cat(
        kOp, ": on rank ", group->rank(), " these parameters received no gradient in the last ",
        "backward pass: ", missing,
        ". If some parameters take no part in producing the loss, construct "
        "DistributedDataParallel with find_unused_parameters = true"));
  }

  bool joining() const { return join != nullptr && join->announcing(); }

  // Called at forward: readies the state for the coming backward.
  void arm() {
    if (armed && any_ready && next_bucket < buckets.size()) throw_missing();
    // A forward without backward, or a backward that failed before its end: let buckets
    // already issued complete.
    if (armed) finish();
    if (options.rebuild_buckets && order_complete && !rebuilt) {
      if (joining())
        join->announce(detail::JoinChannel::Op::kRebuildBuckets, Tensor(), 0, ReduceOp::kSum,
                       join_index);
      rebuild();
    }
    ready.assign(params.size(), 0);
    for (Bucket& b : buckets) b.pending = b.params.size();
    next_bucket = 0;
    any_ready = false;
    armed = true;
  }

  void rebuild() {
    // Rank 0's order, so that every rank builds the same buckets.
    std::vector<char> seen(params.size(), 0);
    std::vector<int64_t> order;
    for (size_t i : ready_order) {
      if (!seen[i]) order.push_back(static_cast<int64_t>(i));
      seen[i] = 1;
    }
    for (size_t i = params.size(); i-- > 0;) {
      if (!seen[i]) order.push_back(static_cast<int64_t>(i));
    }
    Tensor t = from_vector<int64_t>(order, {static_cast<int64_t>(order.size())})
                   .to(group->tensor_device());
    if (group->size() > 1) group->broadcast(t, 0)->wait();
    std::vector<size_t> agreed;
    for (int64_t i : t.to_vector<int64_t>()) agreed.push_back(static_cast<size_t>(i));
    build(agreed);
    rebuilt = true;
  }

  void mark_ready(size_t i, bool from_hook) {
    EMBER_CHECK(!ready[i], kOp, "parameter \"", names[i],
                "\" received its gradient twice in one backward pass (a second backward "
                "without a new forward, or the parameter reached through reentrant "
                "backward); run forward again before each backward");
    ready[i] = 1;
    if (from_hook) any_ready = true;
    if (from_hook && !order_complete) ready_order.push_back(i);
    if (--buckets[bucket_of[i]].pending == 0) launch_ready(from_hook);
  }

  void on_gradient(size_t i) {
    if (!armed) return;
    NoGradGuard no_grad;
    const Tensor& g = params[i].grad();
    if (g.requires_grad() && !warned_create_graph) {
      // As PyTorch's reducer: the average crosses the ranks without history.
      warned_create_graph = true;
      std::fprintf(stderr,
                   "ember: DistributedDataParallel: backward with create_graph=true averages "
                   "the gradients across ranks without their history, so a second backward "
                   "through the parameters' grad() misses those terms. For gradient penalties "
                   "take the inner gradients with autograd::grad (DDP does not reduce them) and "
                   "call backward() without create_graph. (Said once per model.)\n");
      std::fflush(stderr);
    }
    ensure_flat(buckets[bucket_of[i]]);
    Tensor view = view_of(i);
    if (!same_view(g, view)) {
      view.copy_(g);
      params[i].set_grad(view);
    }
    mark_ready(i, true);
  }

  // Issues buckets strictly in index order, so every rank issues the same sequence. The sum
  // is divided by the world size, or under a Join asked to, by the ranks still training
  // (joined ranks contribute zeros).
  void launch_ready(bool in_backward) {
    NoGradGuard no_grad;
    const bool announce = joining();
    const bool by_active = announce && !join->options().divide_by_initial_world_size;
    const double divisor = by_active ? active_ranks : group->size();
    while (next_bucket < buckets.size() && buckets[next_bucket].pending == 0) {
      Bucket& b = buckets[next_bucket++];
      ensure_flat(b);  // ZeRO-2: a bucket none of whose gradients arrived (all unused)
      Tensor sent = b.flat;
      ReduceOp op = ReduceOp::kAvg;
      if (options.compression) {
        sent = b.wire = (b.flat / divisor).to(*options.compression);
        op = ReduceOp::kSum;
      } else if (by_active) {
        b.flat.div_(divisor);
        op = ReduceOp::kSum;
      }
      const CollectiveTag tag("DDP bucket " + std::to_string(next_bucket - 1));
      if (sharded()) {
        // ZeRO-2: each owner's segment reduced to it alone.
        for (size_t rank = 0; rank < b.segments.size(); ++rank) {
          const auto [begin, numel] = b.segments[rank];
          if (numel > 0)
            b.works.push_back(
                group->reduce(sent.narrow(0, begin, numel), static_cast<int>(rank), op));
        }
      } else {
        // The bucket's index travels as the root: a joined rank shadows it in its own bucket.
        if (announce)
          join->announce(detail::JoinChannel::Op::kAllreduce, sent,
                         static_cast<int>(next_bucket - 1), op, join_index);
        b.works.push_back(group->allreduce(sent, op));
      }
      if (trace::enabled() && !b.works.empty())
        timer.watch(next_bucket - 1, static_cast<int64_t>(sent.nbytes()), b.works.back(),
                    group->backend() != "nccl");
      if (sharded()) compact_completed();
    }
    if (next_bucket < buckets.size()) return;
    // In a backward pass, the wait comes once the pass has gone through its whole graph (as
    // PyTorch's reducer queues it), not inside the node whose hook came last.
    if (!in_backward) return finish();
    autograd::queue_callback([weak = self] {
      if (auto reducer = weak.lock(); reducer && reducer->armed) reducer->finish();
    });
  }

  // Waits for the bucket's collectives and brings a compressed copy home.
  void complete(Bucket& b) {
    for (WorkHandle& w : b.works) w->wait();
    b.works.clear();
    if (b.wire.defined() && !sharded()) {
      b.flat.copy_(b.wire);
      b.wire = Tensor();
    }
  }

  // ZeRO-2: releases the issued buckets whose reductions are done, so that a backward holds
  // few buckets at a time. Only on backends whose collectives finish on the host (on NCCL a
  // completed Work has merely been ordered on the stream).
  void compact_completed() {
    if (group->backend() == "nccl") return;
    for (size_t k = 0; k < next_bucket; ++k) {
      Bucket& b = buckets[k];
      if (b.compacted || !std::all_of(b.works.begin(), b.works.end(),
                                      [](const WorkHandle& w) { return w->is_completed(); }))
        continue;
      complete(b);
      compact(b);
    }
  }

  void finish() {
    {
      const trace::Range waiting(trace::Category::kWait, "DDP wait for all-reduce");
      NoGradGuard no_grad;
      for (size_t k = 0; k < buckets.size(); ++k) {
        complete(buckets[k]);
        // ZeRO-2: the reduced buckets only (a forward without backward issued none).
        if (sharded() && k < next_bucket && !buckets[k].compacted) compact(buckets[k]);
      }
    }
    if (trace::enabled()) timer.drain();  // this step's buckets in its trace
    armed = false;
    if (!ready_order.empty()) order_complete = true;
  }
};

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 DDPOptions options)
    : DistributedDataParallel(std::move(module), detail::default_group_for(kOp), options) {}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<ProcessGroup> group,
                                                 DDPOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(options) {
  EMBER_CHECK(module_ != nullptr, kOp, "the module is null");
  EMBER_CHECK(group_ != nullptr, kOp, "the process group is null");
  EMBER_CHECK(options_.bucket_cap_bytes > 0 && options_.first_bucket_cap_bytes > 0, kOp,
              "bucket caps must be positive, got ", options_.first_bucket_cap_bytes, " and ",
              options_.bucket_cap_bytes);
  EMBER_CHECK(
      !options_.compression || *options_.compression == kBF16 || *options_.compression == kF16, kOp,
      "compression must be bf16 or f16, got ", options_.compression ? *options_.compression : kF32);
  register_module("module", module_);

  reducer_ = std::make_shared<Reducer>();
  reducer_->self = reducer_;
  Reducer& r = *reducer_;
  r.group = group_.get();
  r.options = options_;
  for (auto& [n, p] : module_->named_parameters()) {
    if (!p.requires_grad()) continue;
    EMBER_CHECK(p.is_floating_point(), kOp, "parameter \"", n, "\" has dtype ", p.dtype());
    r.names.push_back(n);
    r.params.push_back(p);
  }

  ProcessGroup& pg = *group_;
  if (pg.size() > 1) {
    // Same parameters everywhere: first the counts, then one fingerprint per parameter.
    const auto n = static_cast<int64_t>(r.params.size());
    const Device where = pg.tensor_device();
    const auto counts = gather(pg, from_vector<int64_t>({n}, {1}).to(where));
    for (int rank = 0; rank < pg.size(); ++rank) {
      const auto c = counts[static_cast<size_t>(rank)].item<int64_t>();
      EMBER_CHECK(c == n, kOp, "rank ", pg.rank(), " has ", n, " parameters but rank ", rank,
                  " has ", c, "; every rank must wrap the same model");
    }
    std::vector<int64_t> prints;
    for (size_t i = 0; i < r.params.size(); ++i)
      prints.push_back(fingerprint(r.names[i], r.params[i]));
    if (!prints.empty()) {
      const auto all = gather(pg, from_vector<int64_t>(prints, {n}).to(where));
      for (int rank = 0; rank < pg.size(); ++rank) {
        const auto theirs = all[static_cast<size_t>(rank)].to_vector<int64_t>();
        for (size_t i = 0; i < prints.size(); ++i) {
          EMBER_CHECK(theirs[i] == prints[i], kOp, "parameter ", i,
                      " differs across ranks: ", describe(r.names[i], r.params[i]), " on rank ",
                      pg.rank(), " does not match rank ", rank, "'s parameter ", i,
                      "; every rank must wrap the same model");
        }
      }
    }
    // Everyone starts from rank 0's values.
    std::vector<Tensor> state;
    for (auto& [name, t] : module_->state_dict()) state.push_back(t);
    detail::broadcast_coalesced(pg, state, 0, options_.broadcast_bucket_bytes);
  }

  std::vector<size_t> order;
  for (size_t i = r.params.size(); i-- > 0;) order.push_back(i);
  r.build(order);

  std::weak_ptr<Reducer> weak = reducer_;
  for (size_t i = 0; i < r.params.size(); ++i) {
    r.params[i].register_post_accumulate_grad_hook([weak, i](const Tensor&) {
      if (auto reducer = weak.lock()) reducer->on_gradient(i);
    });
  }
}

DistributedDataParallel::~DistributedDataParallel() = default;

bool DistributedDataParallel::prepare_forward() {
  Reducer& r = *reducer_;
  // Under a Join: count the ranks still training; buffers come from the highest of them.
  detail::JoinChannel* join = r.joining() ? join_.get() : nullptr;
  int root = 0;
  r.active_ranks = group_->size();
  if (join != nullptr) {
    const auto info = join->announce_forward(join_index_);
    root = info.authoritative_rank;
    r.active_ranks = info.active_ranks;
  }
  if (options_.broadcast_buffers && group_->size() > 1) {
    std::vector<Tensor> buffers;
    for (auto& [name, t] : module_->named_buffers()) buffers.push_back(t);
    detail::broadcast_coalesced(*group_, buffers, root, options_.broadcast_bucket_bytes, join);
  }
  const bool sync = sync_enabled_ && GradMode::is_enabled() && is_training();
  r.scale_held_averages();
  if (sync) r.arm();
  r.point_grads();
  return sync;
}

void DistributedDataParallel::mark_unreached_parameters(const nn::TensorList& outputs) {
  // Walk the graph from the outputs: parameters it does not reach get no gradient.
  Reducer& r = *reducer_;
  std::unordered_set<const AutogradMeta*> reached;
  std::unordered_set<const autograd::Node*> visited;
  std::vector<autograd::Node*> stack;
  for (const Tensor& output : outputs) {
    if (output.defined() && output.requires_grad() && output.grad_fn())
      stack.push_back(output.grad_fn().get());
    if (output.defined() && output.is_leaf()) reached.insert(output.autograd_meta());
  }
  while (!stack.empty()) {
    autograd::Node* node = stack.back();
    stack.pop_back();
    if (!visited.insert(node).second) continue;
    if (auto* acc = dynamic_cast<autograd::AccumulateGrad*>(node))
      reached.insert(acc->leaf().autograd_meta());
    for (const auto& edge : node->next_edges()) {
      if (edge.valid()) stack.push_back(edge.node.get());
    }
  }
  for (size_t i = 0; i < r.params.size(); ++i) {
    if (!reached.count(r.params[i].autograd_meta())) r.mark_ready(i, false);
  }
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  const bool sync = prepare_forward();
  Tensor output = (*module_)(input);
  if (sync && options_.find_unused_parameters) mark_unreached_parameters({output});
  return output;
}

nn::TensorList DistributedDataParallel::forward_list(const nn::TensorList& inputs) {
  const bool sync = prepare_forward();
  nn::TensorList outputs = (*module_)(inputs);
  if (sync && options_.find_unused_parameters) mark_unreached_parameters(outputs);
  return outputs;
}

void DistributedDataParallel::synchronize() {
  Reducer& r = *reducer_;
  if (!r.armed) return;
  if (r.next_bucket < r.buckets.size()) r.throw_missing();
  r.finish();
}

std::vector<std::vector<std::string>> DistributedDataParallel::bucket_parameter_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : reducer_->buckets) {
    out.emplace_back();
    for (size_t i : b.params) out.back().push_back(reducer_->names[i]);
  }
  return out;
}

bool DistributedDataParallel::buckets_rebuilt() const { return reducer_->rebuilt; }

void DistributedDataParallel::reduce_to_owners(const std::function<int(const Tensor&)>& owner_of) {
  Reducer& r = *reducer_;
  EMBER_CHECK(!r.armed, kOp, "reduce_to_owners: a backward is pending; call it between iterations");
  EMBER_CHECK(join_ == nullptr, kOp,
              "reduce_to_owners: ZeRO-2 does not run under a Join (its reduces are not shadowed)");
  std::vector<int> owners;
  for (size_t i = 0; i < r.params.size(); ++i) {
    const int rank = owner_of(r.params[i]);
    EMBER_CHECK(rank >= 0 && rank < group_->size(), kOp, "reduce_to_owners: parameter \"",
                r.names[i], "\" is owned by rank ", rank, " of a group of ", group_->size());
    owners.push_back(rank);
  }
  r.owner = std::move(owners);
  r.reduced.assign(r.params.size(), Tensor());
  // The same bucket order as now, each bucket regrouped by owner.
  std::vector<size_t> order;
  for (const auto& b : r.buckets) order.insert(order.end(), b.params.begin(), b.params.end());
  r.build(order);
}

bool DistributedDataParallel::reduces_to_owners() const { return reducer_->sharded(); }

void DistributedDataParallel::set_join(std::shared_ptr<detail::JoinChannel> channel, int index) {
  EMBER_CHECK(channel == nullptr || !reducer_->sharded(), "Join",
              "a DistributedDataParallel reducing gradients to their owners (ZeRO-2) cannot be "
              "joined: its reduces are not shadowed");
  join_ = std::move(channel);
  join_index_ = index;
  reducer_->join = join_.get();
  reducer_->join_index = index;
}

void DistributedDataParallel::join_rebuild_buckets() {
  Reducer& r = *reducer_;
  EMBER_CHECK(!r.rebuilt, kOp, "rank ", group_->rank(),
              " joined with its buckets rebuilt already, yet the ranks still training rebuild "
              "theirs now");
  r.rebuild();
}

void DistributedDataParallel::join_shadow_bucket(size_t bucket, int64_t numel, ReduceOp op) {
  Reducer& r = *reducer_;
  EMBER_CHECK(bucket < r.buckets.size(), "Join", "the ranks still training all-reduce bucket ",
              bucket, " of their DistributedDataParallel but rank ", group_->rank(), "'s has ",
              r.buckets.size());
  NoGradGuard no_grad;
  Reducer::Bucket& b = r.buckets[bucket];
  r.ensure_flat(b);
  EMBER_CHECK(b.flat.numel() == numel, "Join", "bucket ", bucket, " holds ", b.flat.numel(),
              " elements on rank ", group_->rank(), " but ", numel, " on the ranks still training");
  // This rank contributes zeros and keeps the active ranks' average, in its gradients.
  b.flat.zero_();
  if (options_.compression) {
    const Tensor wire = zeros({numel}, TensorOptions(*options_.compression, b.flat.device()));
    group_->allreduce(wire, op)->wait();
    b.flat.copy_(wire);
  } else {
    group_->allreduce(b.flat, op)->wait();
  }
  for (size_t i : b.params) r.point_grad(i);
}

void DistributedDataParallel::join_sync_final_model(int root) {
  if (group_->size() == 1) return;
  std::vector<Tensor> state;
  for (auto& [name, t] : module_->state_dict()) state.push_back(t);
  detail::broadcast_coalesced(*group_, state, root, options_.broadcast_bucket_bytes);
}

DistributedDataParallel::NoSyncGuard::NoSyncGuard(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.sync_enabled_) {
  ddp_.sync_enabled_ = false;
}

DistributedDataParallel::NoSyncGuard::~NoSyncGuard() { ddp_.sync_enabled_ = previous_; }

}  // namespace ember::dist
