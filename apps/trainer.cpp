#include "trainer.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <numeric>
#include <regex>
#include <set>
#include <tuple>

#include <ember/dist/ddp.h>
#include <ember/dist/metrics.h>
#include <ember/dist/sharded_checkpoint.h>
#include <ember/dist/zero.h>
#include <ember/ember.h>
#include <ember/tensor/allocator.h>

#include "trace_report.h"

namespace fs = std::filesystem;

namespace ember::apps {

namespace {
// Logits and targets one row per prediction. A language model (--model gpt) gives its classes
// last: [B, T, V] against [B, T] become [B * T, V] against [B * T], as minGPT flattens them.
// Every other model keeps PyTorch's rule (classes in dim 1, e.g. [N, C, H, W] against
// [N, H, W]): the shapes alone cannot tell the two apart, so the model kind decides.
std::pair<Tensor, Tensor> per_target(const Tensor& logits, const Tensor& y, bool classes_last) {
  if (!classes_last) return {logits, y};
  return {logits.reshape({-1, logits.size(-1)}), y.reshape({-1})};
}

// Sets a flag for its scope (the Trainer's capturing_ while a step is captured).
class FlagScope {
 public:
  explicit FlagScope(bool& flag) : flag_(flag) { flag_ = true; }
  ~FlagScope() { flag_ = false; }
  FlagScope(const FlagScope&) = delete;
  FlagScope& operator=(const FlagScope&) = delete;

 private:
  bool& flag_;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A sharded snapshot's folder holds the shards, their index and this file: the rest of the
// snapshot (everything but the model and optimizer), written by dist::save_checkpoint.
constexpr const char* kSnapshotRest = "snapshot.safetensors";

// Where a snapshot's header lives: the file itself, or a sharded snapshot's kSnapshotRest.
std::string header_path(const std::string& snapshot) {
  std::error_code ec;
  return fs::is_directory(snapshot, ec) ? (fs::path(snapshot) / kSnapshotRest).string() : snapshot;
}
std::map<std::string, std::string> snapshot_metadata(const std::string& snapshot) {
  return dist::read_checkpoint_metadata(header_path(snapshot));
}
}  // namespace

std::vector<optim::ParamGroup> parameter_groups(const nn::Module& model, bool no_decay_norm_bias) {
  if (!no_decay_norm_bias) return {optim::ParamGroup(model.parameters())};
  std::vector<Tensor> decay, no_decay;
  for (const Tensor& p : model.parameters()) (p.dim() <= 1 ? no_decay : decay).push_back(p);
  return {optim::ParamGroup(decay), optim::ParamGroup(no_decay, {{"weight_decay", 0.0}})};
}

Trainer::Trainer(const TrainOptions& options, nn::Module& model, nn::Module& trained,
                 optim::Optimizer& optimizer, optim::LRScheduler* schedule,
                 dist::ProcessGroup& group, Device device)
    : options_(options),
      model_(model),
      trained_(trained),
      optimizer_(optimizer),
      schedule_(schedule),
      group_(group),
      device_(device),
      initial_schedule_(schedule != nullptr ? schedule->state_dict() : optim::StateDict{}) {
  for (const Tensor& p : model.parameters()) {
    if (!is_floating(p.dtype())) continue;
    input_dtype_ = p.dtype();
    break;
  }
}

Tensor Trainer::model_input(const Tensor& x) const {
  return input_dtype_ == kF64 && is_floating(x.dtype()) ? x.to(kF64) : x;
}

std::string cuda_graphs_refusal(const TrainOptions& options, Device device, int world_size) {
  if (!device.is_cuda()) return "CUDA graphs need a CUDA device";
  if (world_size > 1)
    return "not with " + std::to_string(world_size) +
           " processes (DDP's all-reduces run from backward hooks and wait on the host)";
  if (options.accum_steps > 1) return "not with --accum-steps (one micro-batch per step)";
  return "";
}

void Trainer::forward_backward(const Tensor& x, const Tensor& target, double scale,
                               BatchResult& result) {
  Tensor logits, y, loss;
  {
    const trace::Range traced(trace::Category::kUser, "forward", traced_device());
    const auto autocast = precision_ != nullptr ? precision_->autocast() : nullptr;
    std::tie(logits, y) = per_target(call_model(model_input(x)), target, is_gpt(options_));
    loss = cross_entropy(logits, y, {.label_smoothing = options_.label_smoothing});
  }
  const Tensor mean_part = scale == 1.0 ? loss : loss * scale;
  {
    const trace::Range traced(trace::Category::kUser, "backward", traced_device());
    (precision_ != nullptr ? precision_->scale(mean_part) : mean_part).backward();
  }
  NoGradGuard no_grad;
  result.loss = result.loss + loss.to(kF64) * scale;
  result.correct = result.correct + sum(eq(argmax(logits, 1), y)).to(kF64);
}

// NOTE: on CUDA a batch is copied on a stream of its own, so the copy overlaps the kernels of
// the step before it that are still running; the compute stream waits for it through an
// event, and the tensor is marked as used there (record_stream), so the caching allocator
// gives its block back to the copy stream only once the step is done with it.
Tensor Trainer::to_device(const Tensor& t) {
  if (!device_.is_cuda()) return t.to(device_, true);
  const cuda::Stream compute = cuda::current_stream(device_.index);
  if (!copy_stream_) copy_stream_ = cuda::Stream::create(device_.index);
  Tensor out;
  {
    cuda::StreamGuard on_copy_stream(*copy_stream_);
    out = t.to(device_, true);
  }
  cuda::Event copied;
  copied.record(*copy_stream_);
  copied.wait(compute);
  cuda::record_stream(out.storage().data(), compute);
  return out;
}

Tensor Trainer::call_model(const Tensor& x) {
  return &trained_ == &model_ ? model_(x) : trained_.forward(x);
}

void Trainer::update_parameters() {
  const trace::Range traced(trace::Category::kOptimizer, "optimizer step", traced_device());
  if (options_.grad_clip > 0) {
    if (precision_ != nullptr) precision_->unscale_(optimizer_);  // clip the true gradients
    // Under --zero the norm is summed over every rank's shard of the gradients.
    if (auto* zero = dynamic_cast<dist::ZeroRedundancyOptimizer*>(&optimizer_)) {
      zero->clip_grad_norm_(options_.grad_clip);
    } else {
      optim::clip_grad_norm_(model_.parameters(), options_.grad_clip);
    }
  }
  if (precision_ != nullptr) {
    precision_->step(optimizer_);  // fp16: skipped on inf/NaN gradients
  } else {
    optimizer_.step();
  }
}

void Trainer::advance() {
  if (schedule_ != nullptr) schedule_->step();
  ++step_;
}

void Trainer::cuda_graphs_off(const std::string& why) {
  graphs_ = Graphs::kOff;
  if (group_.rank() != 0) return;
  std::printf("ember-train: --cuda-graphs: %s; running eagerly\n", why.c_str());
  std::fflush(stdout);
}

bool Trainer::use_cuda_graph(const data::Batch& batch) {
  if (graphs_ == Graphs::kUndecided) {
    graphs_ = Graphs::kOff;
    if (options_.cuda_graphs) {
      std::string why = cuda_graphs_refusal(options_, device_, group_.size());
      if (why.empty()) {
        try {
          optimizer_.set_capturable(true);  // lr and step counts read on the device
        } catch (const Error& e) {
          why = e.what();
        }
      }
      if (why.empty())
        graphs_ = Graphs::kOn;
      else
        cuda_graphs_off(why);
    }
  }
  if (graphs_ != Graphs::kOn) return false;
  if (captured_ != nullptr) return batch.data.sizes() == captured_->x.sizes();  // else eager
  if (graph_warmup_ < kGraphWarmupSteps) {
    ++graph_warmup_;
    return false;
  }
  // The optimizer step goes into the graph once it reads nothing from the host: its state
  // exists (an fp16 step skipped before SGD's momentum buffers did leaves them missing).
  const std::string why = optimizer_.device_step_refusal();
  if (!why.empty()) {
    if (++graph_warmup_ < kGraphMaxWarmupSteps) return false;
    cuda_graphs_off("the optimizer step cannot be captured after " +
                    std::to_string(kGraphMaxWarmupSteps) + " warm-up steps (" + optimizer_.name() +
                    ", " + why + ")");
    return false;
  }
  return capture_step(batch);
}

bool Trainer::capture_step(const data::Batch& batch) {
  auto step = std::make_unique<CapturedStep>();
  // Static buffers: every later batch is copied into them before a replay.
  step->x = batch.data.to(device_);
  step->y = batch.target.to(device_);
  // No gradients: the capture's backward allocates them from the graph's pool and each
  // replay rewrites them there. The lr scalars hold this step's lr before the capture, so
  // the captured step writes none.
  optimizer_.zero_grad();
  optimizer_.prepare_capturable();
  try {
    cuda::capture(step->graph, [&] {
      const FlagScope capturing(capturing_);
      BatchResult r;
      r.loss = zeros({}, TensorOptions(kF64, device_));
      r.correct = zeros({}, TensorOptions(kF64, device_));
      forward_backward(step->x, step->y, 1.0, r);
      update_parameters();
      step->loss = r.loss;
      step->correct = r.correct;
    });
  } catch (const Error& e) {
    optimizer_.zero_grad();
    cuda_graphs_off(std::string("the training step could not be captured (") + e.what() + ")");
    return false;
  }
  captured_ = std::move(step);
  return true;
}

BatchResult Trainer::run_batch(const data::Batch& batch) {
  const int64_t micro_steps = options_.accum_steps, size = batch.data.size(0);
  EMBER_CHECK(micro_steps >= 1 && size % micro_steps == 0, "Trainer::run_batch", "a batch of ",
              size, " does not split into ", micro_steps, " equal micro-batches");
  BatchResult result;
  result.count = batch.target.numel();  // images, or a sequence model's tokens
  if (use_cuda_graph(batch)) {
    // Staged on the copy stream (overlapping the previous replay), then one copy on the
    // device into the static buffers, ordered after that replay.
    captured_->x.copy_(to_device(batch.data), true);
    captured_->y.copy_(to_device(batch.target), true);
    optimizer_.prepare_capturable();  // this step's lr, for the replay to read
    {
      const trace::Range traced(trace::Category::kUser, "CUDA graph replay", traced_device());
      captured_->graph.replay();
    }
    advance();
    result.loss = captured_->loss.clone();  // the next replay rewrites the graph's own
    result.correct = captured_->correct.clone();
    return result;
  }
  const int64_t micro = size / micro_steps;
  auto* ddp = dynamic_cast<dist::DistributedDataParallel*>(&trained_);
  result.loss = zeros({}, TensorOptions(kF64, device_));
  result.correct = zeros({}, TensorOptions(kF64, device_));
  // Once a graph holds the gradients, an eager step (a batch of another size) zeroes them in
  // place, so the graph's replays keep writing where the optimizer reads.
  optimizer_.zero_grad(captured_ == nullptr);
  // The batch's mean loss is the mean of the micro-batches' mean losses (equal sizes).
  const double scale = 1.0 / static_cast<double>(micro_steps);
  auto micro_step = [&](int64_t k) {
    forward_backward(to_device(batch.data.narrow(0, k * micro, micro)),
                     to_device(batch.target.narrow(0, k * micro, micro)), scale, result);
  };
  for (int64_t k = 0; k < micro_steps; ++k) {
    if (ddp != nullptr && k + 1 < micro_steps) {
      auto no_sync = ddp->no_sync();  // gradients accumulate locally; the last one all-reduces
      micro_step(k);
    } else {
      micro_step(k);
    }
  }
  update_parameters();
  advance();
  return result;
}

void Trainer::attach(data::DataLoader& train_loader, data::DataLoader& test_loader,
                     dist::Checkpoint* checkpoint, MetricsLog& metrics, Progress& progress) {
  train_loader_ = &train_loader;
  test_loader_ = &test_loader;
  checkpoint_ = checkpoint;
  metrics_ = &metrics;
  progress_ = &progress;
  steps_per_epoch_ = train_loader.size();
}

int64_t Trainer::steps_per_epoch() const {
  EMBER_CHECK(train_loader_ != nullptr, "Trainer", "attach() the loaders first");
  return steps_per_epoch_;
}

int64_t Trainer::log_every() const {
  if (options_.log_every > 0) return options_.log_every;
  return std::max<int64_t>(1, steps_per_epoch() / 50);
}

int64_t Trainer::eval_every() const {
  if (options_.eval_every_steps > 0) return options_.eval_every_steps;
  if (options_.max_steps > 0 || options_.epochs >= 4) return 0;
  return std::max<int64_t>(1, options_.epochs * steps_per_epoch() / 4);
}

double Trainer::current_lr() const { return optimizer_.param_groups().front().lr(); }

EvalResult Trainer::evaluate() {
  EMBER_CHECK(test_loader_ != nullptr, "Trainer::evaluate", "attach() the loaders first");
  trained_.eval();
  NoGradGuard no_grad;
  double loss_sum = 0, correct = 0, count = 0;
  test_loader_->set_epoch(0);  // the same evaluation set (GPT: the same windows) every time
  for (const data::Batch& batch : *test_loader_) {
    const Tensor x = model_input(batch.data.to(device_, true));
    const auto autocast = precision_ != nullptr ? precision_->autocast() : nullptr;
    const auto [logits, y] =
        per_target(trained_.forward(x), batch.target.to(device_, true), is_gpt(options_));
    loss_sum += cross_entropy(logits, y, {.reduction = Reduction::kSum}).item<double>();
    correct += sum(eq(argmax(logits, 1), y)).item<double>();
    count += static_cast<double>(y.numel());
  }
  // Every rank evaluated its shard; sum the totals.
  Tensor totals = from_vector<double>({loss_sum, correct, count});
  group_.allreduce(totals)->wait();
  const auto t = totals.to_vector<double>();
  trained_.train();
  last_eval_ = {t[0] / std::max(t[2], 1.0), t[1] / std::max(t[2], 1.0)};
  return last_eval_;
}

void Trainer::read_back() {
  const auto v = stack({device_sums_.loss_sum, device_sums_.correct, device_sums_.window_loss,
                        device_sums_.last_loss})
                     .to_vector<double>();
  sums_.loss_sum = v[0];
  sums_.correct = v[1];
  window_.loss = v[2];
  last_loss_ = v[3];
}

void Trainer::record_step(const BatchResult& r, double lr, bool last) {
  const auto per_epoch = static_cast<double>(steps_per_epoch_);
  {
    NoGradGuard no_grad;
    device_sums_.loss_sum = device_sums_.loss_sum + r.loss * static_cast<double>(r.count);
    device_sums_.correct = device_sums_.correct + r.correct;
    device_sums_.window_loss = device_sums_.window_loss + r.loss;
    device_sums_.last_loss = r.loss;
  }
  window_.images += r.count * group_.size();
  ++window_.steps;
  const bool log_due = step_ % log_every() == 0 || last;
  const bool eval_due = eval_every() > 0 && step_ % eval_every() == 0 && !last;
  const bool save_due = snapshots() && options_.save_every_steps > 0 &&
                        step_ % options_.save_every_steps == 0 && !last;
  if (log_due || eval_due || save_due || progress_->prints_line(sums_.batches)) read_back();
  progress_->update(sums_.batches, sums_.seen_images, last_loss_);
  if (log_due) {
    // Rank 0's loss: the curve is for reading, the epoch record averages across ranks.
    metrics_->step(step_, static_cast<double>(step_) / per_epoch,
                   window_.loss / static_cast<double>(window_.steps), lr,
                   static_cast<double>(window_.images) / seconds_since(window_.start));
    window_ = {};
    device_sums_.window_loss = zeros({}, TensorOptions(kF64, device_));
  }
  if (eval_due) {
    const EvalResult e = evaluate();
    metrics_->eval(step_, static_cast<double>(step_) / per_epoch, e.loss, e.accuracy);
    window_.start = std::chrono::steady_clock::now();  // evaluation time is not training
  }
}

bool Trainer::run_epoch(int64_t epoch) {
  train_loader_->set_epoch(static_cast<uint64_t>(epoch));
  const int64_t per_epoch = steps_per_epoch();
  // A snapshot taken mid-epoch left the sampler past the batches already run.
  const int64_t done_before = per_epoch - train_loader_->size();
  if (done_before == 0) sums_ = {};
  sums_.batches = done_before;
  sums_.pass_batches = 0;
  sums_.seen_images = 0;
  const TensorOptions f64(kF64, device_);
  device_sums_ = {scalar_tensor(sums_.loss_sum, f64), scalar_tensor(sums_.correct, f64),
                  zeros({}, f64), zeros({}, f64)};
  progress_->start_epoch(epoch, options_.epochs, per_epoch);
  const auto epoch_start = std::chrono::steady_clock::now();
  window_ = {};
  bool more = true;
  trained_.train();
  int64_t waited_from = trace::now_ns();
  for (const data::Batch& batch : *train_loader_) {
    if (trace::enabled())
      trace::record(trace::Category::kData, "data wait", waited_from, trace::now_ns());
    const double lr = current_lr();  // the lr this step runs with
    const BatchResult r = run_batch(batch);
    ++sums_.batches;
    ++sums_.pass_batches;
    sums_.seen += static_cast<double>(r.count);
    sums_.seen_images += r.count * group_.size();
    const bool stop = options_.max_steps > 0 && step_ >= options_.max_steps;
    const bool last = sums_.batches == per_epoch || stop;
    record_step(r, lr, last);
    if (snapshots() && options_.save_every_steps > 0 && step_ % options_.save_every_steps == 0 &&
        !last)
      save_snapshot(epoch);  // the epoch's end (or the run's) saves its own
    if (profiler_) profiler_->step();
    waited_from = trace::now_ns();
    if (stop) {
      more = false;
      break;
    }
  }
  progress_->finish_epoch();
  const double epoch_seconds = seconds_since(epoch_start);
  finish_epoch(epoch, static_cast<double>(sums_.seen_images) / epoch_seconds, epoch_seconds);
  return more;
}

void Trainer::finish_epoch(int64_t epoch, double images_per_s, double epoch_seconds) {
  const auto train_stats =
      dist::average_across_ranks({{"loss", sums_.loss_sum / std::max(sums_.seen, 1.0)},
                                  {"accuracy", sums_.correct / std::max(sums_.seen, 1.0)}},
                                 group_);
  const EvalResult e = evaluate();
  const double epoch_at = static_cast<double>(step_) / static_cast<double>(steps_per_epoch_);
  metrics_->eval(step_, epoch_at, e.loss, e.accuracy);
  metrics_->epoch(step_, epoch + 1, train_stats.at("loss"), train_stats.at("accuracy"), e.loss,
                  e.accuracy, images_per_s, current_lr(), epoch_seconds, seconds_since(run_start_));
  if (metrics_->enabled()) {
    std::printf(
        "epoch %ld/%ld: train loss %.4f acc %.2f%% | test loss %.4f acc %.2f%% | %.0f %s/s | "
        "%s\n",
        static_cast<long>(epoch + 1), static_cast<long>(options_.epochs), train_stats.at("loss"),
        100 * train_stats.at("accuracy"), e.loss, 100 * e.accuracy, images_per_s,
        progress_->unit().c_str(), format_duration(epoch_seconds).c_str());
    std::fflush(stdout);
  }
}

std::vector<SnapshotFile> list_snapshots(const std::string& dir,
                                         std::vector<std::string>* unreadable) {
  std::vector<SnapshotFile> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  // Files of plain snapshots, folders of sharded ones.
  const std::regex file(R"(checkpoint-(epoch|step)-\d+\.safetensors)");
  const std::regex folder(R"(checkpoint-(epoch|step)-\d+)");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string path = entry.path().string();
    std::error_code is_dir_ec;
    if (!std::regex_match(entry.path().filename().string(),
                          entry.is_directory(is_dir_ec) ? folder : file))
      continue;
    try {
      const auto meta = snapshot_metadata(path);
      auto integer = [&](const char* key) {
        const auto it = meta.find(key);
        EMBER_CHECK(it != meta.end(), "load_checkpoint", path, ": the header has no \"", key, "\"");
        return std::stoll(it->second);
      };
      out.push_back({path, integer("step"), integer("epoch")});
    } catch (const Error& e) {
      if (unreadable != nullptr) unreadable->push_back(e.what());  // names the file
    } catch (const std::exception&) {  // a step or epoch that is not a number
      if (unreadable != nullptr)
        unreadable->push_back("load_checkpoint: " + path + ": step or epoch is not a number");
    }
  }
  std::sort(out.begin(), out.end(), [](const SnapshotFile& a, const SnapshotFile& b) {
    return std::tie(a.step, a.epoch, a.path) > std::tie(b.step, b.epoch, b.path);
  });
  return out;
}

void Trainer::save_snapshot(int64_t epoch) {
  EMBER_CHECK(snapshots(), "Trainer::save_snapshot", "no checkpoint state or --checkpoint-dir");
  const bool whole = sums_.batches == steps_per_epoch_;
  EMBER_CHECK(whole || checkpoint_->sampler != nullptr, "Trainer::save_snapshot",
              "a snapshot mid-epoch (step ", step_, ") needs the checkpoint's sampler (the train ",
              "loader's DistributedSampler) to resume at its batch");
  if (group_.rank() == 0) fs::create_directories(options_.checkpoint_dir);
  // Every rank's running sums, so a resumed epoch's record still averages all of them.
  Tensor sums = from_vector<double>({sums_.loss_sum, sums_.correct, sums_.seen});
  group_.allreduce(sums, dist::ReduceOp::kAvg)->wait();
  const auto v = sums.to_vector<double>();
  checkpoint_->values = {{"epoch_loss_sum", v[0]},
                         {"epoch_correct", v[1]},
                         {"epoch_seen", v[2]},
                         {"world_size", static_cast<double>(group_.size())},
                         {"global_batch", static_cast<double>(global_batch())}};
  checkpoint_->texts["model"] = options_.model;
  checkpoint_->epoch = whole ? epoch + 1 : epoch;
  checkpoint_->step = step_;
  checkpoint_->sampler_consumed =
      whole ? 0 : sums_.pass_batches * train_loader_->options().batch_size;
  const std::string name = whole ? "checkpoint-epoch-" + std::to_string(epoch + 1)
                                 : "checkpoint-step-" + std::to_string(step_);
  const auto* zero = dynamic_cast<const dist::ZeroRedundancyOptimizer*>(&optimizer_);
  const std::string path =
      (fs::path(options_.checkpoint_dir) / (zero != nullptr ? name : name + ".safetensors"))
          .string();
  if (zero == nullptr) {
    dist::save_checkpoint(path, *checkpoint_, &group_);
  } else {
    // Under --zero each rank writes its shard: its even share of the parameters (alike on
    // every rank), its own parameters' optimizer state; nothing is gathered. Buffers (batch
    // norm's running statistics) can differ across ranks: rank 0's are saved, as in a plain
    // snapshot. The rest goes beside them, last, so a folder whose rest reads is whole.
    dist::ShardedState state;
    std::set<std::string> buffers;
    for (const auto& [key, t] : model_.named_buffers()) buffers.insert(key);
    for (const auto& [key, t] : model_.state_dict()) {
      if (buffers.count(key) == 0)
        state.replicated["model." + key] = t;
      else if (group_.rank() == 0)
        state.sharded["model." + key] = {t.sizes(), 0, t};
    }
    dist::add_state_dict(state, zero->shard_state_dict());
    dist::save_sharded_checkpoint(path, state, group_);
    dist::Checkpoint rest = *checkpoint_;
    rest.model = nullptr;
    rest.optimizer = nullptr;
    dist::save_checkpoint((fs::path(path) / kSnapshotRest).string(), rest, &group_);
  }
  if (group_.rank() == 0) delete_old_snapshots();
  dist::RankZeroLogger(group_).log("snapshot: " + path);
}

void Trainer::delete_old_snapshots() const {
  if (options_.keep <= 0) return;
  const std::vector<SnapshotFile> all = list_snapshots(options_.checkpoint_dir);
  for (size_t i = static_cast<size_t>(options_.keep); i < all.size(); ++i) {
    std::error_code ec;
    fs::remove_all(all[i].path, ec);  // a file, or a sharded snapshot's folder
  }
}

void Trainer::check_continuable(const std::string& path,
                                const std::map<std::string, std::string>& metadata) const {
  const auto model = metadata.find("texts.model");
  EMBER_CHECK(model == metadata.end() || model->second == options_.model, "Trainer::resume", path,
              " is a snapshot of --model ", model->second, " and this run trains --model ",
              options_.model, ": resume it with --model ", model->second,
              ", or start afresh in another --checkpoint-dir");
  // Refused before anything loads, so --resume auto never takes it for a damaged file.
  const auto saved = metadata.find("values.global_batch");
  if (saved != metadata.end() && options_.max_steps > 0) {
    char* end = nullptr;
    const double global = std::strtod(saved->second.c_str(), &end);
    EMBER_CHECK(end != saved->second.c_str() && *end == '\0' &&
                    global == static_cast<double>(global_batch()),
                "Trainer::resume", path, ": the snapshot's global batch is ", saved->second,
                " and this run's ", global_batch(),
                ": --max-steps counts optimizer steps, whose size changed; resume with the same "
                "global batch (--global-batch-size ",
                saved->second, ") or without --max-steps");
  }
  if (checkpoint_->sampler == nullptr || metadata.count("sampler.epoch") == 0) return;
  const dist::SamplerState state = checkpoint_->sampler->state_from_strings(metadata, "sampler.");
  const std::string why = checkpoint_->sampler->refusal(state);
  EMBER_CHECK(why.empty(), "Trainer::resume", path,
              ": this run's data cannot continue the snapshot's epoch: ", why);
}

int64_t Trainer::load_snapshot(const std::string& path) {
  EMBER_CHECK(checkpoint_ != nullptr, "Trainer::load_snapshot", "attach() a checkpoint first");
  check_continuable(path, snapshot_metadata(path));
  std::error_code ec;
  if (fs::is_directory(path, ec))
    load_sharded_snapshot(path);
  else
    dist::load_checkpoint(path, *checkpoint_, device_, &group_);  // each rank its own random state
  step_ = checkpoint_->step;
  auto value = [this](const char* key, double otherwise) {
    const auto it = checkpoint_->values.find(key);
    return it == checkpoint_->values.end() ? otherwise : it->second;
  };
  sums_ = {value("epoch_loss_sum", 0), value("epoch_correct", 0), value("epoch_seen", 0), 0, 0};
  // Snapshots from before these values were taken on this world with this batch.
  follow_resize(static_cast<int64_t>(value("world_size", group_.size())),
                static_cast<int64_t>(value("global_batch", static_cast<double>(global_batch()))),
                checkpoint_->epoch,
                checkpoint_->sampler != nullptr ? checkpoint_->sampler->epoch() : 0);
  return checkpoint_->epoch;
}

void Trainer::load_sharded_snapshot(const std::string& dir) {
  const size_t before = cpu_memory_stats().allocated_bytes;
  reset_cpu_peak_memory_stats();
  const dist::ShardedCheckpoint snapshot(dir);
  snapshot.load_module(model_);
  // Under --zero each rank reads its own parameters' optimizer state alone (and loads it
  // releasing each parameter's as it goes); a plain optimizer needs all of it.
  if (auto* zero = dynamic_cast<dist::ZeroRedundancyOptimizer*>(&optimizer_)) {
    zero->load_own_state_dict(snapshot.read_state_dict(
        "optimizer.", [zero](const std::string& key) { return zero->owns_state_key(key); }));
  } else {
    optimizer_.load_state_dict(snapshot.read_state_dict());
  }
  sharded_load_ = {cpu_memory_stats().peak_allocated_bytes - before, 0};
  for (const auto& [name, info] : snapshot.tensors()) {
    if (name.starts_with("optimizer."))
      sharded_load_.optimizer_bytes +=
          static_cast<uint64_t>(std::accumulate(info.shape.begin(), info.shape.end(), int64_t{1},
                                                std::multiplies<>())) *
          element_size(info.dtype);
  }
  // The rest: schedule, sampler, every rank's random states, step, epoch, sums.
  dist::Checkpoint rest = *checkpoint_;
  rest.model = nullptr;
  rest.optimizer = nullptr;
  dist::load_checkpoint((fs::path(dir) / kSnapshotRest).string(), rest, device_, &group_);
  checkpoint_->epoch = rest.epoch;
  checkpoint_->step = rest.step;
  checkpoint_->values = rest.values;
  checkpoint_->texts = rest.texts;
  checkpoint_->sampler_consumed = rest.sampler_consumed;
}

int64_t Trainer::global_batch() const {
  return train_loader_->options().batch_size * group_.size();
}

void Trainer::follow_resize(int64_t saved_world, int64_t saved_global, int64_t first_epoch,
                            uint64_t sampler_epoch) {
  using ember::detail::str_cat;
  resize_note_.clear();
  const int64_t world = group_.size(), global = global_batch();
  if (saved_world == world && saved_global == global) return;
  const std::string where =
      str_cat("the snapshot was taken on ", saved_world, " rank(s) with a global batch of ",
              saved_global, "; this run has ", world, " rank(s) with a global batch of ", global,
              " (", train_loader_->options().batch_size, " per rank). ");
  const std::string data =
      checkpoint_->sampler != nullptr
          ? str_cat("The rest of epoch ", first_epoch + 1, " is split among the ", world,
                    " rank(s), each of its samples read once. ")
          : std::string();
  if (saved_global == global) {
    resize_note_ = "resized: " + where + data +
                   "The global batch is the same, so the step counter (" + std::to_string(step_) +
                   ") and the learning-rate schedule continue unchanged.";
    return;
  }
  EMBER_ASSERT(options_.max_steps <= 0, "follow_resize: check_continuable refuses --max-steps");
  // The schedule built for this run, moved to the same point of the run in samples: whole
  // epochs, and the batches of this epoch that the consumed samples make at this global batch.
  const double saved_lr = current_lr();
  const int64_t per_epoch = steps_per_epoch();
  const int64_t done =
      sampler_epoch == static_cast<uint64_t>(first_epoch) ? per_epoch - train_loader_->size() : 0;
  const int64_t at = first_epoch * per_epoch + done;
  if (schedule_ != nullptr) {
    schedule_->load_state_dict(initial_schedule_);
    for (int64_t i = 0; i < at; ++i) schedule_->step();
  }
  resize_note_ =
      "resized: " + where + data +
      str_cat("The learning rate follows the new global batch: the schedule is the one built for ",
              "this run (", per_epoch, " steps per epoch; ember-train scales a ResNet's peak lr ",
              "with the global batch, lr x global batch / 128) and continues at its step ", at,
              ", the same point of the run in samples; the lr is now ", current_lr(),
              " where the snapshot's schedule had ", saved_lr, ". The step counter (", step_,
              ") keeps counting optimizer steps. Pass --global-batch-size ", saved_global,
              " to keep the snapshot's recipe.");
}

int64_t Trainer::resume() {
  const std::string& how = options_.resume;
  if (how.empty()) return 0;
  dist::RankZeroLogger log(group_);
  std::string loaded;
  int64_t epoch = 0;
  if (how != "auto") {
    epoch = load_snapshot(how);
    loaded = how;
  } else {
    std::vector<std::string> problems;
    const std::vector<SnapshotFile> files = list_snapshots(options_.checkpoint_dir, &problems);
    for (size_t i = 0; i < files.size() && loaded.empty(); ++i) {
      // Another model or data is this run's mistake, not a damaged file: never skipped.
      check_continuable(files[i].path, snapshot_metadata(files[i].path));
      try {
        epoch = load_snapshot(files[i].path);
        loaded = files[i].path;
      } catch (const Error& e) {
        problems.push_back(e.what());  // "load_checkpoint: PATH: what is wrong"
      }
    }
    if (group_.rank() == 0) {
      for (const std::string& p : problems)
        std::fprintf(stderr, "Trainer::resume: warning: skipped the damaged snapshot %s\n",
                     p.substr(p.rfind("load_checkpoint: ", 0) == 0 ? 17 : 0).c_str());
    }
  }
  // Every rank must continue from the same step (a folder that only some nodes see would not).
  // With it, the most any rank allocated reading a sharded snapshot.
  Tensor steps =
      from_vector<int64_t>({step_, -step_, static_cast<int64_t>(sharded_load_.peak_bytes),
                            static_cast<int64_t>(sharded_load_.optimizer_bytes)});
  group_.allreduce(steps, dist::ReduceOp::kMax)->wait();
  const auto s = steps.to_vector<int64_t>();
  EMBER_CHECK(s[0] == -s[1], "Trainer::resume", "the ranks resumed at different steps (", -s[1],
              " to ", s[0], "): every rank must see the same snapshots in ",
              options_.checkpoint_dir);
  if (loaded.empty()) {
    log.log("no snapshot in " + options_.checkpoint_dir + ": starting from scratch");
  } else {
    log.log("resumed from " + loaded + " at step " + std::to_string(step_) + " (epoch " +
            std::to_string(epoch + 1) + ")");
    if (!resize_note_.empty()) log.log(resize_note_);
    if (s[3] > 0)
      log.log(ember::detail::str_cat("sharded snapshot read: at most ", s[2],
                                     " bytes allocated on a rank while reading it; the whole "
                                     "optimizer state is ",
                                     s[3], " bytes"));
  }
  return epoch;
}

EvalResult Trainer::train(int64_t first_epoch) {
  run_start_ = std::chrono::steady_clock::now();
  // Resumed from a snapshot taken at the run's end (its last epoch, or --max-steps): nothing
  // is left to train, so the run only evaluates.
  if (first_epoch >= options_.epochs || (options_.max_steps > 0 && step_ >= options_.max_steps))
    return last_eval_ = evaluate();
  if (!options_.trace.empty()) start_trace();
  for (int64_t epoch = first_epoch; epoch < options_.epochs; ++epoch) {
    const bool more = run_epoch(epoch);
    const bool due = (epoch + 1) % options_.checkpoint_interval == 0 ||
                     epoch + 1 == options_.epochs || !more ||
                     (options_.save_every_steps > 0 && step_ % options_.save_every_steps == 0);
    if (snapshots() && due) save_snapshot(epoch);
    if (!more) break;
  }
  if (profiler_) {
    profiler_->stop();  // a window the run cut short is written now
    profiler_.reset();
    if (!trace_written_ && group_.rank() == 0)
      std::fprintf(stderr,
                   "ember-train: --trace: the run ended at step %ld, before step %ld where the "
                   "traced window starts; no trace written\n",
                   static_cast<long>(step_), static_cast<long>(options_.trace_start));
  }
  return last_eval_;
}

void Trainer::start_trace() {
  const int64_t from = std::max(options_.trace_start, step_);
  if (options_.trace_end <= from) {
    if (group_.rank() == 0)
      std::fprintf(stderr,
                   "ember-train: --trace: the run resumes at step %ld, after the traced window "
                   "(steps %ld to %ld); no trace written\n",
                   static_cast<long>(step_), static_cast<long>(options_.trace_start),
                   static_cast<long>(options_.trace_end));
    return;
  }
  trace::set_thread_row_name("main");
  profiler_ = std::make_unique<profiler::Profiler>(profiler::ProfilerOptions{
      .schedule =
          profiler::schedule(options_.trace_start, 0, options_.trace_end - options_.trace_start, 1),
      .on_trace_ready = [this](profiler::Profiler& p) { write_trace(p); }});
  profiler_->start(step_);  // the run's own step count, a resumed run's too
}

void Trainer::write_trace(const profiler::Profiler& profiler) {
  // A window the run's end cut short leaves out the step that never ran a batch (the epoch's
  // end, its evaluation).
  std::vector<trace::Event> events;
  for (const trace::Event& e : profiler.events())
    if (e.step < profiler.step_num()) events.push_back(e);
  const auto figures = write_merged_trace(group_, device_, events, options_.trace);
  trace_written_ = true;
  if (group_.rank() != 0) return;
  std::printf(
      "ember-train: trace of %ld step(s) on %d rank(s) written to %s (open it in "
      "https://ui.perfetto.dev or chrome://tracing)\n%s",
      static_cast<long>(figures[0].steps), group_.size(), options_.trace.c_str(),
      overlap_report(figures).c_str());
  std::fflush(stdout);
}

}  // namespace ember::apps
