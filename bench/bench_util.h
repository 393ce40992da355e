// Timing and output helpers shared by ember's benchmarks: median wall time of interleaved
// repetitions after warm-up, and one JSON object per line.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace ember::bench {

// Seconds per run of each function, as medians: the functions run in turn, `warmup` times
// untimed, then until every one has `min_reps` runs and the first has run for `min_seconds`.
// `sync` runs after each timed call (a device synchronize for asynchronous work).
inline std::vector<double> median_seconds(const std::vector<std::function<void()>>& fns,
                                          const std::function<void()>& sync, int warmup = 2,
                                          int min_reps = 5, double min_seconds = 0.3,
                                          int max_reps = 50) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < warmup; ++i) {
    for (const auto& fn : fns) {
      fn();
      sync();
    }
  }
  std::vector<std::vector<double>> times(fns.size());
  double first_total = 0.0;
  for (int rep = 0; rep < max_reps && (rep < min_reps || first_total < min_seconds); ++rep) {
    for (size_t f = 0; f < fns.size(); ++f) {
      sync();
      const auto start = Clock::now();
      fns[f]();
      sync();
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      times[f].push_back(seconds);
      if (f == 0) first_total += seconds;
    }
  }
  std::vector<double> medians;
  for (auto& t : times) {
    std::sort(t.begin(), t.end());
    const size_t n = t.size();
    medians.push_back(n % 2 == 1 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]));
  }
  return medians;
}

// One flat JSON object, printed on one line in insertion order.
class JsonLine {
 public:
  JsonLine& add(const std::string& key, const std::string& value) {
    fields_.emplace_back(key, "\"" + value + "\"");
    return *this;
  }
  JsonLine& add(const std::string& key, const char* value) { return add(key, std::string(value)); }
  JsonLine& add(const std::string& key, bool value) {
    fields_.emplace_back(key, value ? "true" : "false");
    return *this;
  }
  JsonLine& add(const std::string& key, long long value) {
    fields_.emplace_back(key, std::to_string(value));
    return *this;
  }
  JsonLine& add(const std::string& key, int value) {
    return add(key, static_cast<long long>(value));
  }
  JsonLine& add(const std::string& key, long value) {
    return add(key, static_cast<long long>(value));
  }
  JsonLine& add(const std::string& key, double value) {
    char text[64];
    std::snprintf(text, sizeof(text), "%.4g", value);
    fields_.emplace_back(key, text);
    return *this;
  }
  void print() const {
    std::string line = "{";
    for (size_t i = 0; i < fields_.size(); ++i) {
      if (i > 0) line += ", ";
      line += "\"" + fields_[i].first + "\": " + fields_[i].second;
    }
    line += "}";
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

// A TCP port of 127.0.0.1 that nothing uses now (the kernel picks it); 0 if none.
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return port;
}

}  // namespace ember::bench
