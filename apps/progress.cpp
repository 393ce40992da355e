#include "progress.h"

#include <unistd.h>

#include <cstdio>
#include <utility>

namespace ember::apps {

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof text, "%ldh%02ldm", static_cast<long>(s / 3600),
                  static_cast<long>(s / 60 % 60));
  } else if (s >= 60) {
    std::snprintf(text, sizeof text, "%ldm%02lds", static_cast<long>(s / 60),
                  static_cast<long>(s % 60));
  } else {
    std::snprintf(text, sizeof text, "%lds", static_cast<long>(s));
  }
  return text;
}

Progress::Progress(bool enabled, int64_t log_interval, std::string unit)
    : enabled_(enabled),
      terminal_(enabled && isatty(STDOUT_FILENO) == 1),
      unit_(std::move(unit)),
      log_interval_(log_interval) {}

void Progress::start_epoch(int64_t epoch, int64_t epochs, int64_t steps) {
  epoch_ = epoch;
  epochs_ = epochs;
  steps_ = steps;
  start_ = std::chrono::steady_clock::now();
}

void Progress::update(int64_t step, int64_t images, double loss) {
  if (!enabled_) return;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = elapsed > 0 ? static_cast<double>(images) / elapsed : 0.0;
  const double eta =
      step > 0 ? elapsed / static_cast<double>(step) * static_cast<double>(steps_ - step) : 0.0;
  if (terminal_) {
    constexpr int kWidth = 30;
    const int filled = steps_ > 0 ? static_cast<int>(kWidth * step / steps_) : kWidth;
    std::printf("\repoch %ld/%ld [%.*s%*s] %ld/%ld | %.0f %s/s | loss %.4f | ETA %s   ",
                static_cast<long>(epoch_ + 1), static_cast<long>(epochs_), filled,
                "##############################", kWidth - filled, "", static_cast<long>(step),
                static_cast<long>(steps_), rate, unit_.c_str(), loss, format_duration(eta).c_str());
    std::fflush(stdout);
  } else if (prints_line(step)) {
    std::printf("epoch %ld/%ld step %ld/%ld | %.0f %s/s | loss %.4f | ETA %s\n",
                static_cast<long>(epoch_ + 1), static_cast<long>(epochs_), static_cast<long>(step),
                static_cast<long>(steps_), rate, unit_.c_str(), loss, format_duration(eta).c_str());
    std::fflush(stdout);
  }
}

bool Progress::prints_line(int64_t step) const {
  return enabled_ && !terminal_ && (step % log_interval_ == 0 || step == steps_);
}

void Progress::finish_epoch() {
  if (enabled_ && terminal_) std::printf("\n");
}

}  // namespace ember::apps
