// Progress reporting for ember-train: a live bar on a terminal, periodic lines otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ember::apps {

class Progress {
 public:
  // `enabled` is false on every rank but 0.
  // unit: what the rate counts per second ("img", or "tok" for a language model).
  Progress(bool enabled, int64_t log_interval, std::string unit = "img");
  const std::string& unit() const { return unit_; }
  void start_epoch(int64_t epoch, int64_t epochs, int64_t steps);
  // After each step: images/s over the epoch so far, the running loss and the ETA.
  void update(int64_t step, int64_t images, double loss);
  // Whether update() at `step` prints a line of its own (not on a terminal, every
  // log_interval steps and at the epoch's end): the loss it shows must be current then. A
  // terminal's bar shows the loss as last read.
  bool prints_line(int64_t step) const;
  void finish_epoch();

 private:
  bool enabled_, terminal_;
  std::string unit_;
  int64_t log_interval_, epoch_ = 0, epochs_ = 0, steps_ = 0;
  std::chrono::steady_clock::time_point start_;
};

// "1h02m", "3m07s", "12s"
std::string format_duration(double seconds);

}  // namespace ember::apps
