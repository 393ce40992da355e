#include "metrics_log.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace fs = std::filesystem;

namespace ember::apps {

MetricsLog::MetricsLog(const fs::path& out_dir, bool enabled, bool append,
                       std::string throughput_key)
    : enabled_(enabled),
      throughput_key_(std::move(throughput_key)),
      dir_(out_dir),
      jsonl_path_(out_dir / "metrics.jsonl") {
  if (!enabled_) return;
  fs::create_directories(dir_);
  open(append ? std::ios::app : std::ios::trunc);
}

void MetricsLog::open(std::ios::openmode mode) {
  jsonl_.open(jsonl_path_, mode);
  steps_csv_.open(dir_ / "steps.csv", mode);
  evals_csv_.open(dir_ / "evals.csv", mode);
}

namespace {
// Rewrites `path` without the lines whose step (step_of(line)) is after `step`.
template <typename StepOf>
void keep_lines_until(const fs::path& path, int64_t step, StepOf step_of) {
  std::ifstream in(path);
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    if (step_of(line) <= step) kept += line + "\n";
  }
  in.close();
  std::ofstream(path, std::ios::trunc) << kept;
}

int64_t leading_integer(const std::string& text, size_t at) {
  try {
    return std::stoll(text.substr(at));
  } catch (const std::exception&) {
    return -1;  // not a record: kept
  }
}
}  // namespace

void MetricsLog::drop_after(int64_t step) {
  if (!enabled_) return;
  jsonl_.close();
  steps_csv_.close();
  evals_csv_.close();
  keep_lines_until(jsonl_path_, step, [](const std::string& line) {
    const std::string key = "\"step\": ";
    const size_t at = line.find(key);
    return at == std::string::npos ? -1 : leading_integer(line, at + key.size());
  });
  for (const char* csv : {"steps.csv", "evals.csv"})
    keep_lines_until(dir_ / csv, step,
                     [](const std::string& line) { return leading_integer(line, 0); });
  open(std::ios::app);
}

void MetricsLog::write(const std::string& line) { jsonl_ << line << "\n" << std::flush; }

std::string MetricsLog::precision_fields() const {
  if (precision_ == nullptr) return "";
  char fields[160];
  std::snprintf(fields, sizeof fields, ", \"precision\": \"%s\", \"skipped_steps\": %ld",
                precision_->name(), static_cast<long>(precision_->skipped_steps()));
  std::string out = fields;
  if (precision_->precision() == Precision::kFP16) {
    std::snprintf(fields, sizeof fields, ", \"loss_scale\": %.9g", precision_->loss_scale());
    out += fields;
  }
  return out;
}

void MetricsLog::step(int64_t step, double epoch, double loss, double lr, double per_s) {
  if (!enabled_) return;
  char line[256];
  std::snprintf(
      line, sizeof line,
      "{\"kind\": \"step\", \"step\": %ld, \"epoch\": %.4f, \"loss\": %.5f, \"lr\": %.6g, "
      "\"%s\": %.1f",
      static_cast<long>(step), epoch, loss, lr, throughput_key_.c_str(), per_s);
  write(line + precision_fields() + "}");
  steps_csv_ << step << "," << loss << "," << lr << "\n" << std::flush;
}

void MetricsLog::eval(int64_t step, double epoch, double test_loss, double test_accuracy) {
  if (!enabled_) return;
  char line[256];
  std::snprintf(line, sizeof line,
                "{\"kind\": \"eval\", \"step\": %ld, \"epoch\": %.4f, \"test_loss\": %.5f, "
                "\"test_accuracy\": %.5f}",
                static_cast<long>(step), epoch, test_loss, test_accuracy);
  write(line);
  evals_csv_ << step << "," << test_loss << "," << test_accuracy << "\n" << std::flush;
}

void MetricsLog::epoch(int64_t step, int64_t epoch, double train_loss, double train_accuracy,
                       double test_loss, double test_accuracy, double per_s, double lr,
                       double epoch_s, double elapsed_s) {
  if (!enabled_) return;
  char line[512];
  std::snprintf(line, sizeof line,
                "{\"kind\": \"epoch\", \"step\": %ld, \"epoch\": %ld, \"train_loss\": %.5f, "
                "\"train_accuracy\": %.5f, \"test_loss\": %.5f, \"test_accuracy\": %.5f, "
                "\"%s\": %.1f, \"lr\": %.6g, \"epoch_s\": %.1f, \"elapsed_s\": %.1f",
                static_cast<long>(step), static_cast<long>(epoch), train_loss, train_accuracy,
                test_loss, test_accuracy, throughput_key_.c_str(), per_s, lr, epoch_s, elapsed_s);
  write(line + precision_fields() + "}");
}

std::string MetricsLog::plot(int64_t steps_per_epoch, int64_t last_step) {
  if (!enabled_) return "";
  jsonl_.flush();
  steps_csv_.flush();
  evals_csv_.flush();
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    std::printf("gnuplot not found: skipped the plot (apt-get install gnuplot-nox)\n");
    return "";
  }
  const fs::path png = dir_ / "curves.png", script = dir_ / "curves.gnuplot";
  const std::string steps = (dir_ / "steps.csv").string(), evals = (dir_ / "evals.csv").string();
  std::ofstream out(script);
  out << "set terminal png size 1500,450\n"
      << "set output '" << png.string() << "'\n"
      << "set datafile separator ','\n"
      << "set multiplot layout 1,3\n"
      << "set xlabel 'optimizer step (" << steps_per_epoch << " per epoch)'\n"
      << "set grid\nset key top right\n"
      // One step axis for the three panels (a single evaluation would get its own range);
      // points on the top or bottom edge stay visible.
      << "set xrange [0:" << std::max<int64_t>(last_step, 1) << "]\n"
      << "set offsets 0, 0, graph 0.05, graph 0.05\n"
      << "set yrange [0<*:*]\nset title 'loss'\n"
      << "plot '" << steps << "' using 1:2 with lines lc rgb '#4070c0' title 'train (per step)', '"
      << evals << "' using 1:2 with linespoints pt 7 ps 1.2 lc rgb '#d04020' title 'test'\n"
      << "set yrange [0<*<100:0<*<100]\nset title 'test accuracy (%)'\nset key bottom right\n"
      << "plot '" << evals
      << "' using 1:($3*100) with linespoints pt 7 ps 1.2 lc rgb '#d04020' title 'test'\n"
      << "set yrange [0<*:*]\nset title 'learning rate'\nset key top right\n"
      << "plot '" << steps << "' using 1:3 with lines lc rgb '#208040' title 'lr'\n"
      << "unset multiplot\n";
  out.close();
  // gnuplot warns about a one-point range (one evaluation); the plot is still drawn.
  if (std::system(("gnuplot '" + script.string() + "' 2>/dev/null").c_str()) != 0 ||
      !fs::exists(png)) {
    std::printf("gnuplot failed: no plot (the metrics are in %s)\n", jsonl_path_.c_str());
    return "";
  }
  return png.string();
}

}  // namespace ember::apps
