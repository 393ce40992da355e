#include "trainer.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <ember/dist/ddp.h>
#include <ember/dist/metrics.h>
#include <ember/ember.h>

namespace fs = std::filesystem;

namespace ember::apps {

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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
      device_(device) {}

BatchResult Trainer::run_batch(const data::Batch& batch) {
  const int64_t micro_steps = options_.accum_steps, size = batch.data.size(0);
  EMBER_CHECK(micro_steps >= 1 && size % micro_steps == 0, "Trainer::run_batch", "a batch of ",
              size, " does not split into ", micro_steps, " equal micro-batches");
  const int64_t micro = size / micro_steps;
  auto* ddp = dynamic_cast<dist::DistributedDataParallel*>(&trained_);
  BatchResult result;
  optimizer_.zero_grad();
  // The batch's mean loss is the mean of the micro-batches' mean losses (equal sizes).
  const double scale = 1.0 / static_cast<double>(micro_steps);
  auto micro_step = [&](int64_t k) {
    const Tensor x = batch.data.narrow(0, k * micro, micro).to(device_, true);
    const Tensor y = batch.target.narrow(0, k * micro, micro).to(device_, true);
    Tensor logits, loss;
    {
      const auto autocast = precision_ != nullptr ? precision_->autocast() : nullptr;
      logits = trained_.forward(x);
      loss = cross_entropy(logits, y, {.label_smoothing = options_.label_smoothing});
    }
    const Tensor mean_part = micro_steps == 1 ? loss : loss * scale;
    (precision_ != nullptr ? precision_->scale(mean_part) : mean_part).backward();
    result.loss += loss.item<double>() * scale;
    NoGradGuard no_grad;
    result.correct += sum(eq(argmax(logits, 1), y)).item<double>();
  };
  for (int64_t k = 0; k < micro_steps; ++k) {
    if (ddp != nullptr && k + 1 < micro_steps) {
      auto no_sync = ddp->no_sync();  // gradients accumulate locally; the last one all-reduces
      micro_step(k);
    } else {
      micro_step(k);
    }
  }
  if (options_.grad_clip > 0) {
    if (precision_ != nullptr) precision_->unscale_(optimizer_);  // clip the true gradients
    optim::clip_grad_norm_(model_.parameters(), options_.grad_clip);
  }
  if (precision_ != nullptr) {
    precision_->step(optimizer_);  // fp16: skipped on inf/NaN gradients
  } else {
    optimizer_.step();
  }
  if (schedule_ != nullptr) schedule_->step();
  ++step_;
  result.count = size;
  return result;
}

void Trainer::attach(data::DataLoader& train_loader, data::DataLoader& test_loader,
                     dist::Checkpoint* checkpoint, MetricsLog& metrics, Progress& progress) {
  train_loader_ = &train_loader;
  test_loader_ = &test_loader;
  checkpoint_ = checkpoint;
  metrics_ = &metrics;
  progress_ = &progress;
}

int64_t Trainer::steps_per_epoch() const {
  EMBER_CHECK(train_loader_ != nullptr, "Trainer", "attach() the loaders first");
  return train_loader_->size();
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
  for (const data::Batch& batch : *test_loader_) {
    const Tensor x = batch.data.to(device_, true), y = batch.target.to(device_, true);
    const auto autocast = precision_ != nullptr ? precision_->autocast() : nullptr;
    const Tensor logits = trained_.forward(x);
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

bool Trainer::run_epoch(int64_t epoch) {
  const int64_t per_epoch = steps_per_epoch(), every = log_every(), eval_every = this->eval_every();
  train_loader_->set_epoch(static_cast<uint64_t>(epoch));
  progress_->start_epoch(epoch, options_.epochs, per_epoch);
  const auto epoch_start = std::chrono::steady_clock::now();
  auto window_start = epoch_start;
  double loss_sum = 0, correct = 0, seen = 0, window_loss = 0;
  int64_t images = 0, window_images = 0, window_steps = 0, batches = 0;
  bool more = true;
  trained_.train();
  for (const data::Batch& batch : *train_loader_) {
    const double lr = current_lr();  // the lr this step runs with
    const BatchResult r = run_batch(batch);
    ++batches;
    loss_sum += r.loss * static_cast<double>(r.count);
    correct += r.correct;
    seen += static_cast<double>(r.count);
    images += r.count * group_.size();
    window_loss += r.loss;
    window_images += r.count * group_.size();
    ++window_steps;
    progress_->update(batches, images, r.loss);
    const bool last =
        batches == per_epoch || (options_.max_steps > 0 && step_ >= options_.max_steps);
    if (step_ % every == 0 || last) {
      // Rank 0's loss: the curve is for reading, the epoch record averages across ranks.
      metrics_->step(step_, static_cast<double>(step_) / static_cast<double>(per_epoch),
                     window_loss / static_cast<double>(window_steps), lr,
                     static_cast<double>(window_images) / seconds_since(window_start));
      window_loss = 0;
      window_images = window_steps = 0;
      window_start = std::chrono::steady_clock::now();
    }
    if (eval_every > 0 && step_ % eval_every == 0 && !last) {
      const EvalResult e = evaluate();
      metrics_->eval(step_, static_cast<double>(step_) / static_cast<double>(per_epoch), e.loss,
                     e.accuracy);
      window_start = std::chrono::steady_clock::now();  // evaluation time is not training
    }
    if (options_.max_steps > 0 && step_ >= options_.max_steps) {
      more = false;
      break;
    }
  }
  progress_->finish_epoch();
  const double epoch_seconds = seconds_since(epoch_start);
  const auto train_stats = dist::average_across_ranks(
      {{"loss", loss_sum / std::max(seen, 1.0)}, {"accuracy", correct / std::max(seen, 1.0)}},
      group_);
  const EvalResult e = evaluate();
  const double epoch_at = static_cast<double>(step_) / static_cast<double>(per_epoch);
  metrics_->eval(step_, epoch_at, e.loss, e.accuracy);
  const double rate = static_cast<double>(images) / epoch_seconds;
  metrics_->epoch(step_, epoch + 1, train_stats.at("loss"), train_stats.at("accuracy"), e.loss,
                  e.accuracy, rate, current_lr(), epoch_seconds, seconds_since(run_start_));
  if (metrics_->enabled()) {
    std::printf(
        "epoch %ld/%ld: train loss %.4f acc %.2f%% | test loss %.4f acc %.2f%% | %.0f img/s | "
        "%s\n",
        static_cast<long>(epoch + 1), static_cast<long>(options_.epochs), train_stats.at("loss"),
        100 * train_stats.at("accuracy"), e.loss, 100 * e.accuracy, rate,
        format_duration(epoch_seconds).c_str());
    std::fflush(stdout);
  }
  return more;
}

void Trainer::save_snapshot(int64_t epoch) {
  EMBER_CHECK(checkpoint_ != nullptr && !options_.checkpoint_dir.empty(), "Trainer::save_snapshot",
              "no checkpoint state or --checkpoint-dir");
  if (group_.rank() == 0) fs::create_directories(options_.checkpoint_dir);
  checkpoint_->epoch = epoch + 1;
  checkpoint_->step = step_;
  const std::string path = (fs::path(options_.checkpoint_dir) /
                            ("checkpoint-epoch-" + std::to_string(epoch + 1) + ".safetensors"))
                               .string();
  dist::save_checkpoint(path, *checkpoint_, &group_);
  dist::RankZeroLogger(group_).log("checkpoint: " + path);
}

EvalResult Trainer::train(int64_t first_epoch) {
  run_start_ = std::chrono::steady_clock::now();
  for (int64_t epoch = first_epoch; epoch < options_.epochs; ++epoch) {
    const bool more = run_epoch(epoch);
    if (checkpoint_ != nullptr && !options_.checkpoint_dir.empty() &&
        ((epoch + 1) % options_.checkpoint_interval == 0 || epoch + 1 == options_.epochs ||
         !more)) {
      save_snapshot(epoch);
    }
    if (!more) break;
  }
  return last_eval_;
}

}  // namespace ember::apps
