#include "trace_report.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

#include <ember/tensor/ops.h>

namespace ember::apps {

namespace {
using trace::Category;

int64_t overlap(int64_t a0, int64_t a1, int64_t b0, int64_t b1) {
  return std::max<int64_t>(0, std::min(a1, b1) - std::max(a0, b0));
}

// Every rank's copy of `values` (one tensor each, the same length), through `device`.
std::vector<Tensor> allgather(dist::ProcessGroup& group, Device device, const Tensor& values) {
  const Tensor mine = values.to(device);
  std::vector<Tensor> all;
  for (int r = 0; r < group.size(); ++r) all.push_back(empty_like(mine));
  group.allgather(all, mine)->wait();
  for (Tensor& t : all) t = t.to(Device());
  return all;
}
}  // namespace

OverlapFigures overlap_figures(const std::vector<trace::Event>& events) {
  OverlapFigures f;
  int64_t step_ns = 0, wait_ns = 0, comm_ns = 0, hidden_ns = 0;
  // Backward's compute: each pass up to the start of DDP's wait inside it.
  std::vector<std::pair<int64_t, int64_t>> compute;
  for (const trace::Event& e : events) {
    const int64_t end = e.start_ns + e.dur_ns;
    if (e.category == Category::kStep) {
      ++f.steps;
      step_ns += e.dur_ns;
    } else if (e.category == Category::kWait) {
      wait_ns += e.dur_ns;
    } else if (e.category == Category::kAutograd) {
      int64_t until = end;
      for (const trace::Event& w : events) {
        if (w.category == Category::kWait && w.start_ns >= e.start_ns && w.start_ns <= end)
          until = std::min(until, w.start_ns);
      }
      compute.emplace_back(e.start_ns, until);
    }
  }
  for (const trace::Event& e : events) {
    if (e.category != Category::kComm) continue;
    comm_ns += e.dur_ns;
    for (const auto& [a, b] : compute)
      hidden_ns += overlap(e.start_ns, e.start_ns + e.dur_ns, a, b);
  }
  if (comm_ns > 0) f.hidden = static_cast<double>(hidden_ns) / static_cast<double>(comm_ns);
  const double per_step = f.steps > 0 ? 1e-6 / static_cast<double>(f.steps) : 0;
  f.allreduce_ms = static_cast<double>(comm_ns) * per_step;
  f.wait_ms = static_cast<double>(wait_ns) * per_step;
  f.step_ms = static_cast<double>(step_ns) * per_step;
  return f;
}

int64_t clock_offset_ns(dist::ProcessGroup& group, Device device) {
  constexpr int kRounds = 7;
  std::vector<int64_t> offsets;
  const Tensor token = zeros({1}, TensorOptions(kF64, device));
  for (int round = 0; round < kRounds; ++round) {
    group.allreduce(token)->wait();
    (void)token.to_vector<double>();  // on a device: the host waits for the all-reduce here
    const int64_t now = trace::now_ns();
    const auto all = allgather(group, device, from_vector<int64_t>({now}, {1}));
    offsets.push_back(now - all[0].item<int64_t>());
  }
  std::nth_element(offsets.begin(), offsets.begin() + kRounds / 2, offsets.end());
  return offsets[kRounds / 2];
}

std::vector<OverlapFigures> write_merged_trace(dist::ProcessGroup& group, Device device,
                                               const std::vector<trace::Event>& events,
                                               const std::string& path) {
  const int64_t offset = clock_offset_ns(group, device);
  // The origin is the earliest first event of any rank (on rank 0's clock), so no event has
  // a negative timestamp (Perfetto drops those); converted back to this rank's clock.
  int64_t first = std::numeric_limits<int64_t>::max();
  for (const trace::Event& e : events) first = std::min(first, e.start_ns - offset);
  if (events.empty()) first = trace::now_ns() - offset;
  int64_t earliest = first;
  for (const Tensor& f : allgather(group, device, from_vector<int64_t>({first}, {1})))
    earliest = std::min(earliest, f.item<int64_t>());
  const int64_t origin = earliest + offset;
  const std::string mine = trace::chrome_trace_events(events, group.rank(), origin);

  // The fragments, padded to the longest, gathered everywhere (rank 0 writes them).
  const auto lengths = allgather(group, device, from_vector<int64_t>({int64_t(mine.size())}, {1}));
  int64_t longest = 0;
  for (const Tensor& l : lengths) longest = std::max(longest, l.item<int64_t>());
  Tensor bytes = zeros({longest}, TensorOptions(kU8));
  std::memcpy(bytes.data_ptr(), mine.data(), mine.size());
  const auto fragments = allgather(group, device, bytes);

  const OverlapFigures f = overlap_figures(events);
  const auto figures = allgather(
      group, device,
      from_vector<double>({double(f.steps), f.hidden, f.allreduce_ms, f.wait_ms, f.step_ms}, {5}));
  std::vector<OverlapFigures> out;
  for (const Tensor& t : figures) {
    const auto v = t.to_vector<double>();
    out.push_back({static_cast<int64_t>(v[0]), v[1], v[2], v[3], v[4]});
  }
  if (group.rank() != 0) return out;
  std::vector<std::string> texts;
  for (size_t r = 0; r < fragments.size(); ++r) {
    const auto n = static_cast<size_t>(lengths[r].item<int64_t>());
    texts.emplace_back(static_cast<const char*>(fragments[r].data_ptr()), n);
  }
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  EMBER_CHECK(file.good(), "ember-train --trace", "cannot write ", path, ": ",
              std::strerror(errno));
  trace::write_chrome_trace(file, texts);
  file.flush();
  EMBER_CHECK(file.good(), "ember-train --trace", "writing ", path,
              " failed: ", std::strerror(errno));
  return out;
}

std::string overlap_report(const std::vector<OverlapFigures>& ranks) {
  std::string out;
  char line[512];
  size_t slowest = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const OverlapFigures& f = ranks[r];
    if (f.busy_ms() > ranks[slowest].busy_ms()) slowest = r;
    if (f.hidden < 0) {
      std::snprintf(line, sizeof line, "overlap: rank %zu: no all-reduce traced; step %.2f ms\n", r,
                    f.step_ms);
    } else {
      std::snprintf(line, sizeof line,
                    "overlap: rank %zu: %.1f%% of all-reduce time hidden behind backward (%.2f ms "
                    "per step); the optimizer waited %.2f ms per step for the last bucket; step "
                    "%.2f ms, busy %.2f ms\n",
                    r, 100 * f.hidden, f.allreduce_ms, f.wait_ms, f.step_ms, f.busy_ms());
    }
    out += line;
  }
  if (!ranks.empty()) {
    std::snprintf(line, sizeof line,
                  "overlap: slowest rank: %zu (busy %.2f ms per step, without waiting for "
                  "all-reduces)\n",
                  slowest, ranks[slowest].busy_ms());
    out += line;
  }
  return out;
}

}  // namespace ember::apps
