// ember-train's metrics: JSONL records per logged step, per evaluation and per epoch, and
// the PNG of the curves (gnuplot), all on the optimizer-step axis.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "precision.h"

namespace ember::apps {

// Writes out_dir/metrics.jsonl (one JSON object a line, "kind" = "step", "eval" or
// "epoch") and two CSV files gnuplot reads (steps.csv, evals.csv). Only the writer rank
// makes one with enabled = true; a disabled log ignores every call.
class MetricsLog {
 public:
  // append: continue the files of a resumed run instead of starting them again.
  // throughput_key names the records' throughput field: "images_per_s" for image models,
  // "tokens_per_s" for a GPT, whose steps are counted in tokens.
  MetricsLog(const std::filesystem::path& out_dir, bool enabled, bool append,
             std::string throughput_key = "images_per_s");
  bool enabled() const { return enabled_; }
  // A run resumed from a snapshot of `step`: the records after it (written by the run that
  // stopped) are dropped, so each step appears once.
  void drop_after(int64_t step);
  const std::filesystem::path& jsonl_path() const { return jsonl_path_; }
  // The mean training loss over the steps since the last record, the lr of the last one.
  void step(int64_t step, double epoch, double loss, double lr, double per_s);
  void eval(int64_t step, double epoch, double test_loss, double test_accuracy);
  void epoch(int64_t step, int64_t epoch, double train_loss, double train_accuracy,
             double test_loss, double test_accuracy, double per_s, double lr, double epoch_s,
             double elapsed_s);
  // Step and epoch records then carry "precision", "skipped_steps" (optimizer steps skipped
  // for inf/NaN gradients) and, in fp16, "loss_scale". Not owned; null: no such fields.
  void set_precision(const PrecisionContext* precision) { precision_ = precision; }
  // out_dir/curves.png: training loss per step with test loss per evaluation, test accuracy,
  // and the lr, side by side on one step axis from 0 to last_step. Returns the path, or ""
  // (with the reason printed) when gnuplot is missing or fails.
  std::string plot(int64_t steps_per_epoch, int64_t last_step);

 private:
  void write(const std::string& line);
  void open(std::ios::openmode mode);
  // ", \"precision\": ..." for the records, or "" without a precision context.
  std::string precision_fields() const;
  bool enabled_;
  std::string throughput_key_;
  std::filesystem::path dir_, jsonl_path_;
  std::ofstream jsonl_, steps_csv_, evals_csv_;
  const PrecisionContext* precision_ = nullptr;
};

}  // namespace ember::apps
