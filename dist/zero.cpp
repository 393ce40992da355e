#include "zero.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <string>

#include <ember/optim/clip_grad.h>
#include <ember/tensor/grad_mode.h>
#include <ember/tensor/ops.h>

#include "ddp.h"
#include "detail/coalesced.h"
#include "detail/default_group.h"
#include "join.h"

namespace ember::dist {

namespace {

// The parameter index k of a state dict key "state.<k>.<name>" (name not empty), or nothing.
std::optional<size_t> state_index(const std::string& key) {
  if (!key.starts_with("state.")) return std::nullopt;
  const size_t dot = key.find('.', 6);
  if (dot == std::string::npos || dot == 6 || dot > 15 || dot + 1 == key.size())
    return std::nullopt;
  const std::string digits = key.substr(6, dot - 6);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return static_cast<size_t>(std::stoull(digits));
}

constexpr const char* kOp = "ZeroRedundancyOptimizer";
// The largest piece a step's parameter broadcast sends at a time (its extra memory).
constexpr size_t kBroadcastPieceBytes = size_t{32} << 20;
// The tag of consolidate_state_dict's messages, and bounds on what a peer may announce.
constexpr int kStateTag = 0x2e50;
constexpr int64_t kMaxBuffers = 64;
constexpr int64_t kMaxNameBytes = int64_t{1} << 24;

std::vector<optim::ParamGroup> one_group(std::vector<Tensor> params) {
  return {optim::ParamGroup(std::move(params))};
}

// The wrapped optimizer over all groups: checks them, and gives its defaults and name.
std::unique_ptr<optim::Optimizer> checked_full(const OptimizerFactory& make,
                                               const std::vector<optim::ParamGroup>& groups) {
  EMBER_CHECK(make != nullptr, kOp, "the optimizer factory is empty");
  std::unique_ptr<optim::Optimizer> full = make(groups);
  EMBER_CHECK(full != nullptr, kOp, "the optimizer factory returned null");
  return full;
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<optim::ParamGroup> groups,
                                                 OptimizerFactory make,
                                                 std::shared_ptr<ProcessGroup> group)
    : ZeroRedundancyOptimizer(groups, make, std::move(group), checked_full(make, groups)) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params, OptimizerFactory make,
                                                 std::shared_ptr<ProcessGroup> group)
    : ZeroRedundancyOptimizer(one_group(std::move(params)), std::move(make), std::move(group)) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<optim::ParamGroup> groups,
                                                 OptimizerFactory make)
    : ZeroRedundancyOptimizer(std::move(groups), std::move(make), detail::default_group_for(kOp)) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params, OptimizerFactory make)
    : ZeroRedundancyOptimizer(one_group(std::move(params)), std::move(make),
                              detail::default_group_for(kOp)) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<optim::ParamGroup> groups,
                                                 OptimizerFactory make,
                                                 std::shared_ptr<ProcessGroup> group,
                                                 std::unique_ptr<optim::Optimizer> reference)
    : Optimizer(kOp, reference->defaults()), group_(std::move(group)), make_(std::move(make)) {
  EMBER_CHECK(group_ != nullptr, kOp, "the process group is null");
  EMBER_CHECK(group_->is_member(), kOp, "this rank (global rank ", group_->global_rank(),
              ") is not a member of the process group");
  for (optim::ParamGroup& g : groups) add_param_group(std::move(g));
  constructed_ = true;

  // The partition (see zero.h): largest first within each group, to the emptiest rank.
  const auto world = static_cast<size_t>(group_->size());
  shard_numels_.assign(world, 0);
  const auto& all = param_groups();
  for (const optim::ParamGroup& g : all) {
    std::vector<size_t> order(g.params.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return g.params[a].numel() > g.params[b].numel(); });
    owner_.emplace_back(g.params.size(), -1);
    partitioned_.push_back(g.params);
    for (size_t i : order) {
      const auto emptiest = static_cast<size_t>(
          std::min_element(shard_numels_.begin(), shard_numels_.end()) - shard_numels_.begin());
      owner_.back()[i] = static_cast<int>(emptiest);
      shard_numels_[emptiest] += g.params[i].numel();
    }
  }

  // This rank's optimizer over its parameters, group by group.
  std::vector<optim::ParamGroup> mine;
  for (size_t g = 0; g < all.size(); ++g) {
    local_index_.emplace_back(all[g].params.size(), -1);
    std::vector<Tensor> own;
    for (size_t i = 0; i < all[g].params.size(); ++i) {
      if (owner_[g][i] != group_->rank()) continue;
      local_index_[g][i] = static_cast<int>(own.size());
      own.push_back(all[g].params[i]);
    }
    local_group_.push_back(own.empty() ? -1 : static_cast<int>(mine.size()));
    if (!own.empty()) mine.emplace_back(std::move(own), all[g].options);
  }
  if (!mine.empty()) {
    local_ = make_(std::move(mine));
    EMBER_CHECK(local_ != nullptr, kOp, "the optimizer factory returned null");
  }
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() = default;

void ZeroRedundancyOptimizer::check_options(const optim::Options& /*options*/) const {
  // The groups given at construction were checked by the wrapped optimizer built over them.
  EMBER_CHECK(!constructed_, kOp,
              "add_param_group after construction is not supported: the partition of the "
              "parameters is fixed; construct the ZeroRedundancyOptimizer with every group");
}

void ZeroRedundancyOptimizer::step_group(optim::ParamGroup& /*group*/,
                                         std::vector<optim::ParamState>& /*state*/,
                                         const DeviceInputs& /*device*/) {
  EMBER_ASSERT(false, kOp, ": step_group is replaced by run_step");
}

int ZeroRedundancyOptimizer::owner(size_t group, size_t index) const {
  EMBER_CHECK(group < owner_.size() && index < owner_[group].size(), kOp, "no parameter ", index,
              " in group ", group, " (", owner_.size(), " groups)");
  return owner_[group][index];
}

int ZeroRedundancyOptimizer::owner(const Tensor& param) const {
  for (size_t g = 0; g < partitioned_.size(); ++g) {
    for (size_t i = 0; i < partitioned_[g].size(); ++i) {
      if (partitioned_[g][i].is_same(param)) return owner_[g][i];
    }
  }
  throw Error(::ember::detail::str_cat(kOp, ": the tensor of shape ", shape_str(param.sizes()),
                                       " is not one of its parameters"));
}

void ZeroRedundancyOptimizer::check_groups_unchanged(const char* op) const {
  const auto& groups = param_groups();
  bool same = groups.size() == partitioned_.size();
  for (size_t g = 0; same && g < groups.size(); ++g) {
    same = groups[g].params.size() == partitioned_[g].size();
    for (size_t i = 0; same && i < partitioned_[g].size(); ++i)
      same = groups[g].params[i].is_same(partitioned_[g][i]);
  }
  EMBER_CHECK(same, op,
              "param_groups() no longer holds the parameters it was constructed with; the "
              "partition is fixed (only options such as lr may change)");
}

std::string ZeroRedundancyOptimizer::device_step_refusal() const {
  return "ZeroRedundancyOptimizer steps on the host path: each step ends in broadcasts of the "
         "updated parameters, which every rank must issue";
}

const optim::ParamState& ZeroRedundancyOptimizer::state(size_t group, size_t index) const {
  const int rank = owner(group, index);
  EMBER_CHECK(rank == group_->rank(), kOp, "parameter ", index, " of group ", group, " is in rank ",
              rank, "'s shard, not in rank ", group_->rank(), "'s");
  return local_->state(static_cast<size_t>(local_group_[group]),
                       static_cast<size_t>(local_index_[group][index]));
}

void ZeroRedundancyOptimizer::run_step(const optim::StepScaling* scaling) {
  EMBER_ASSERT(scaling == nullptr, kOp, ": device-side steps are refused");
  check_groups_unchanged("ZeroRedundancyOptimizer::step");
  // Inside a Join: ranks that ran out step their shards too, on hearing this.
  if (join_ != nullptr && join_->announcing() && group_->size() > 1) {
    const auto info = join_->announce_and_wait(detail::JoinChannel::Op::kZeroStep, join_index_);
    share_joined_gradients(info.active);
  }
  step_and_broadcast();
}

void ZeroRedundancyOptimizer::join_step(const std::vector<int>& active) {
  check_groups_unchanged("ZeroRedundancyOptimizer::step");
  share_joined_gradients(active);
  step_and_broadcast();
}

std::vector<Tensor> ZeroRedundancyOptimizer::shard_of(int rank) const {
  std::vector<Tensor> shard;
  const auto& groups = param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      if (owner_[g][i] == rank) shard.push_back(groups[g].params[i]);
    }
  }
  return shard;
}

void ZeroRedundancyOptimizer::share_joined_gradients(const std::vector<int>& active) {
  NoGradGuard no_grad;
  for (int rank = 0; rank < group_->size(); ++rank) {
    if (std::find(active.begin(), active.end(), rank) != active.end()) continue;
    std::vector<Tensor> grads;
    for (const Tensor& p : shard_of(rank)) {
      EMBER_CHECK(p.grad().defined(), kOp,
                  "under a Join every parameter needs a gradient when "
                  "ranks step; a parameter of shape ",
                  shape_str(p.sizes()), " of rank ", rank, "'s shard has none on rank ",
                  group_->rank());
      grads.push_back(p.grad());
    }
    if (!grads.empty())
      detail::broadcast_coalesced(*group_, grads, active.back(), kBroadcastPieceBytes);
  }
}

void ZeroRedundancyOptimizer::step_and_broadcast() {
  NoGradGuard no_grad;
  const auto& groups = param_groups();
  if (local_ != nullptr) {
    // Options (a schedule's lr) follow this optimizer's groups, as PyTorch's _sync_param_groups.
    for (size_t g = 0; g < groups.size(); ++g) {
      if (local_group_[g] >= 0)
        local_->param_groups()[static_cast<size_t>(local_group_[g])].options = groups[g].options;
    }
    local_->step();
  }
  ++steps_;
  if (group_->size() == 1) return;
  for (int rank = 0; rank < group_->size(); ++rank) {
    const std::vector<Tensor> shard = shard_of(rank);
    if (!shard.empty()) detail::broadcast_coalesced(*group_, shard, rank, kBroadcastPieceBytes);
  }
}

void ZeroRedundancyOptimizer::agree_found_inf(std::vector<std::pair<Device, Tensor>>& flags) {
  if (group_->size() == 1 || !shards_gradients_) return;
  NoGradGuard no_grad;
  const Device where = group_->tensor_device();
  Tensor any = zeros({1}, TensorOptions(kF32, where));
  for (const auto& [device, flag] : flags) any.add_(flag.reshape({1}).to(where, kF32));
  group_->allreduce(any, ReduceOp::kMax)->wait();
  flags.assign(1, {where, any});
}

void ZeroRedundancyOptimizer::shard_gradients(DistributedDataParallel& ddp) {
  EMBER_CHECK(&ddp.group() == group_.get(), kOp,
              "shard_gradients: the DistributedDataParallel uses another process group; both "
              "must use the same one");
  ddp.reduce_to_owners([this](const Tensor& p) { return owner(p); });
  shards_gradients_ = true;
}

void ZeroRedundancyOptimizer::set_join(std::shared_ptr<detail::JoinChannel> channel, int index) {
  join_ = std::move(channel);
  join_index_ = index;
}

std::unique_ptr<optim::Optimizer> ZeroRedundancyOptimizer::make_full() const {
  return checked_full(make_, param_groups());
}

// --- consolidate_state_dict: each rank's shard to rank `to` --------------------------------
//
// Rank r sends, for its parameters in partition order: one i64 header [step, buffer count]
// per parameter plus the total length of the buffer names, the names ('\n'-separated, u8),
// then each buffer in order (the parameter's shape, device and dtype). The receiver checks
// every count before it sizes anything from it.

void ZeroRedundancyOptimizer::send_shard_state(int to) {
  NoGradGuard no_grad;
  const auto& groups = param_groups();
  std::vector<int64_t> header;
  std::string names;
  std::vector<Tensor> buffers;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      if (owner_[g][i] != group_->rank()) continue;
      const optim::ParamState& s = state(g, i);
      header.push_back(s.step_count());
      header.push_back(static_cast<int64_t>(s.buffers.size()));
      for (const auto& [name, buffer] : s.buffers) {
        names += name + "\n";
        buffers.push_back(buffer.contiguous());
      }
    }
  }
  header.push_back(static_cast<int64_t>(names.size()));
  const Device where = group_->tensor_device();
  group_
      ->send(from_vector<int64_t>(header, {static_cast<int64_t>(header.size())}).to(where), to,
             kStateTag)
      ->wait();
  if (!names.empty()) {
    std::vector<uint8_t> bytes(names.begin(), names.end());
    group_
        ->send(from_vector<uint8_t>(bytes, {static_cast<int64_t>(bytes.size())}).to(where), to,
               kStateTag)
        ->wait();
  }
  for (const Tensor& b : buffers) group_->send(b, to, kStateTag)->wait();
}

void ZeroRedundancyOptimizer::receive_shard_state(int from, optim::Optimizer& full) {
  NoGradGuard no_grad;
  const auto& groups = param_groups();
  std::vector<std::pair<size_t, size_t>> theirs;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      if (owner_[g][i] == from) theirs.emplace_back(g, i);
    }
  }
  const Device where = group_->tensor_device();
  const auto n = static_cast<int64_t>(theirs.size());
  Tensor header_t = empty({2 * n + 1}, TensorOptions(kI64, where));
  group_->recv(header_t, from, kStateTag)->wait();
  const std::vector<int64_t> header = header_t.to(kCPU).to_vector<int64_t>();
  const int64_t name_bytes = header.back();
  int64_t total_buffers = 0;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t step = header[static_cast<size_t>(2 * k)];
    const int64_t count = header[static_cast<size_t>(2 * k + 1)];
    EMBER_CHECK(step >= 0 && count >= 0 && count <= kMaxBuffers, kOp,
                "consolidate_state_dict: rank ", from, " sent step ", step, " and ", count,
                " buffers for a parameter (at most ", kMaxBuffers, ")");
    total_buffers += count;
  }
  EMBER_CHECK(name_bytes >= 0 && name_bytes <= kMaxNameBytes, kOp, "consolidate_state_dict: rank ",
              from, " announced ", name_bytes, " bytes of buffer names (at most ", kMaxNameBytes,
              ")");
  std::vector<std::string> names;
  if (name_bytes > 0) {
    Tensor bytes = empty({name_bytes}, TensorOptions(kU8, where));
    group_->recv(bytes, from, kStateTag)->wait();
    const std::vector<uint8_t> raw = bytes.to(kCPU).to_vector<uint8_t>();
    std::string current;
    for (uint8_t c : raw) {
      if (c != '\n') {
        current += static_cast<char>(c);
        continue;
      }
      EMBER_CHECK(!current.empty(), kOp, "consolidate_state_dict: rank ", from,
                  " sent an empty buffer name");
      names.push_back(std::move(current));
      current.clear();
    }
    EMBER_CHECK(current.empty(), kOp, "consolidate_state_dict: rank ", from,
                "'s buffer names do not end in a newline");
  }
  EMBER_CHECK(static_cast<int64_t>(names.size()) == total_buffers, kOp,
              "consolidate_state_dict: rank ", from, " sent ", names.size(), " buffer names for ",
              total_buffers, " buffers");
  size_t next_name = 0;
  for (int64_t k = 0; k < n; ++k) {
    const auto [g, i] = theirs[static_cast<size_t>(k)];
    const Tensor& p = groups[g].params[i];
    optim::ParamState s;
    s.step = header[static_cast<size_t>(2 * k)];
    for (int64_t b = 0; b < header[static_cast<size_t>(2 * k + 1)]; ++b) {
      Tensor buffer = empty(p.sizes(), p.options());
      group_->recv(buffer, from, kStateTag)->wait();
      s.buffers[names[next_name++]] = buffer;
    }
    full.set_state(g, i, s);
  }
}

std::unique_ptr<optim::Optimizer> ZeroRedundancyOptimizer::full_with_own_state() const {
  std::unique_ptr<optim::Optimizer> full = make_full();
  const auto& groups = param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      if (owner_[g][i] == group_->rank()) full->set_state(g, i, state(g, i));
    }
  }
  return full;
}

optim::StateDict ZeroRedundancyOptimizer::shard_state_dict() const {
  check_groups_unchanged("ZeroRedundancyOptimizer::shard_state_dict");
  return full_with_own_state()->state_dict();
}

bool ZeroRedundancyOptimizer::owns_state_key(const std::string& key) const {
  std::optional<size_t> k = state_index(key);
  if (!k) return true;  // no parameter's: the load's check names it
  for (const auto& owners : owner_) {
    if (*k < owners.size()) return owners[*k] == group_->rank();
    *k -= owners.size();
  }
  return true;  // past the last parameter: the check names it
}

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  EMBER_CHECK(to >= 0 && to < group_->size(), kOp, "consolidate_state_dict: rank ", to,
              " is not a rank of the group (size ", group_->size(), ")");
  check_groups_unchanged("ZeroRedundancyOptimizer::consolidate_state_dict");
  consolidated_ = {};
  consolidated_on_ = -1;
  const int rank = group_->rank();
  if (rank != to) {
    send_shard_state(to);
    return;
  }
  std::unique_ptr<optim::Optimizer> full = full_with_own_state();
  for (int from = 0; from < group_->size(); ++from) {
    if (from != rank) receive_shard_state(from, *full);
  }
  consolidated_ = full->state_dict();
  consolidated_on_ = to;
  consolidated_at_ = steps_;
}

optim::StateDict ZeroRedundancyOptimizer::state_dict() const {
  EMBER_CHECK(consolidated_on_ == group_->rank(), kOp, "state_dict: rank ", group_->rank(),
              " holds no consolidated state",
              consolidated_on_ >= 0
                  ? ::ember::detail::str_cat(" (it was gathered on rank ", consolidated_on_, ")")
                  : std::string(),
              "; call consolidate_state_dict(to) on every rank first, then state_dict() on "
              "rank to");
  EMBER_CHECK(consolidated_at_ == steps_, kOp, "state_dict: the state was consolidated ",
              steps_ - consolidated_at_,
              " step(s) ago; call consolidate_state_dict(to) again after the last step");
  return consolidated_;
}

void ZeroRedundancyOptimizer::load_state_dict(const optim::StateDict& dict) {
  // Only this rank's buffers are copied: the others' are left out of the dict loaded (a key
  // of no parameter goes through, for the check to name it).
  optim::StateDict mine;
  mine.scalars = dict.scalars;
  for (const auto& [key, tensor] : dict.tensors) {
    if (owns_state_key(key)) mine.tensors[key] = tensor;
  }
  load_own_state_dict(std::move(mine));
}

void ZeroRedundancyOptimizer::load_own_state_dict(optim::StateDict dict) {
  const char* op = "ZeroRedundancyOptimizer::load_state_dict";
  check_groups_unchanged(op);
  // The wrapped optimizer over every group checks the type, groups, options and steps; the
  // tensors are checked here, before anything changes, and then copied parameter by parameter
  // into the local optimizer's state.
  std::unique_ptr<optim::Optimizer> full = make_full();
  full->load_state_dict({{}, dict.scalars});
  const auto& groups = param_groups();
  std::vector<std::pair<size_t, size_t>> where;  // by index over all groups
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t i = 0; i < groups[g].params.size(); ++i) where.emplace_back(g, i);
  for (const auto& [key, tensor] : dict.tensors) {
    const std::optional<size_t> k = state_index(key);
    EMBER_CHECK(k && *k < where.size() && key.substr(key.find('.', 6) + 1) != "step", op,
                ": unexpected tensor \"", key, "\" (the optimizer has ", where.size(),
                " parameters)");
    const auto [g, i] = where[*k];
    EMBER_CHECK(owner_[g][i] == group_->rank(), op, ": \"", key, "\" is the state of parameter ",
                *k, ", which rank ", owner_[g][i], " owns, not rank ", group_->rank());
    const Tensor& p = groups[g].params[i];
    EMBER_CHECK(tensor.defined() && tensor.sizes() == p.sizes(), op, ": \"", key, "\" has shape ",
                tensor.defined() ? shape_str(tensor.sizes()) : "undefined", " but parameter ", *k,
                " has shape ", shape_str(p.sizes()));
  }
  size_t k = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    param_groups()[g].options = full->param_groups()[g].options;
    const int lg = local_group_[g];
    if (lg >= 0)
      local_->param_groups()[static_cast<size_t>(lg)].options = param_groups()[g].options;
    for (size_t i = 0; i < groups[g].params.size(); ++i, ++k) {
      if (lg < 0 || local_index_[g][i] < 0) continue;
      const std::string prefix = "state." + std::to_string(k) + ".";
      optim::ParamState s;
      s.step = full->state(g, i).step;
      auto it = dict.tensors.lower_bound(prefix);
      const auto first = it;
      for (; it != dict.tensors.end() && it->first.starts_with(prefix); ++it)
        s.buffers[it->first.substr(prefix.size())] = it->second;
      local_->set_state(static_cast<size_t>(lg), static_cast<size_t>(local_index_[g][i]), s);
      dict.tensors.erase(first, it);  // released once copied (where the caller gave them up)
    }
  }
  consolidated_ = {};
  consolidated_on_ = -1;
}

Tensor ZeroRedundancyOptimizer::clip_grad_norm_(double max_norm, double norm_type) {
  EMBER_CHECK(norm_type > 0.0, "ZeroRedundancyOptimizer::clip_grad_norm_",
              "norm_type must be > 0, got ", norm_type);
  EMBER_CHECK(max_norm >= 0.0, "ZeroRedundancyOptimizer::clip_grad_norm_",
              "max_norm must be >= 0, got ", max_norm);
  NoGradGuard no_grad;
  std::vector<Tensor> params;
  std::vector<int> owners;
  for (size_t g = 0; g < param_groups().size(); ++g) {
    const auto& group = param_groups()[g].params;
    params.insert(params.end(), group.begin(), group.end());
    owners.insert(owners.end(), owner_[g].begin(), owner_[g].end());
  }
  if (!shards_gradients_) return optim::clip_grad_norm_(params, max_norm, norm_type);
  // Per parameter, in order: its gradient's norm and whether it has one, filled in by its owner.
  const auto n = static_cast<int64_t>(params.size());
  std::vector<double> local(static_cast<size_t>(2 * n), 0.0);
  for (int64_t k = 0; k < n; ++k) {
    const Tensor& p = params[static_cast<size_t>(k)];
    if (owners[static_cast<size_t>(k)] != group_->rank() || !p.grad().defined()) continue;
    local[static_cast<size_t>(k)] =
        optim::get_total_norm({p.grad()}, norm_type, false).to(kF64).item<double>();
    local[static_cast<size_t>(n + k)] = 1.0;
  }
  Tensor exchanged = from_vector<double>(local, {2 * n}).to(group_->tensor_device());
  if (group_->size() > 1) group_->allreduce(exchanged, ReduceOp::kSum)->wait();
  const std::vector<double> all = exchanged.to(kCPU).to_vector<double>();
  // As optim::get_total_norm combines them: on the first gradient's device, in its dtype.
  std::vector<Tensor> norms;
  TensorOptions at;
  for (int64_t k = 0; k < n; ++k) {
    if (all[static_cast<size_t>(n + k)] == 0.0) continue;
    if (norms.empty()) at = params[static_cast<size_t>(k)].options();
    norms.push_back(scalar_tensor(all[static_cast<size_t>(k)], at));
  }
  if (norms.empty()) return scalar_tensor(0.0, kF32);
  const Tensor total = norms.size() == 1 ? norms.front() : norm(stack(norms), norm_type);
  optim::clip_grads_with_norm_(params, max_norm, total);
  return total;
}

}  // namespace ember::dist
