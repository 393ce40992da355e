// ember-train --trace: every rank's events merged into one Chrome trace by rank 0, and the
// overlap figures (how much all-reduce time backward hid, how long the optimizer waited for
// the last bucket, which rank is slowest) printed at the end of the window.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ember/dist/process_group.h>
#include <ember/tensor/trace.h>

namespace ember::apps {

// One rank's traced steps, from its own events.
struct OverlapFigures {
  int64_t steps = 0;  // ProfilerStep events
  // Share (0..1) of the DDP buckets' all-reduce time that fell inside a backward pass before
  // DDP's wait for the last buckets began; -1 when no all-reduce was traced.
  double hidden = -1;
  // Per step: all-reduce time, DDP's wait for the last buckets (the optimizer waits for it),
  // the whole step, and the step less that wait (what this rank spends on its own).
  double allreduce_ms = 0, wait_ms = 0, step_ms = 0;
  double busy_ms() const { return step_ms - wait_ms; }
};
OverlapFigures overlap_figures(const std::vector<trace::Event>& events);

// Collective over `group` (tensors on `device`): this rank's steady clock minus rank 0's, in
// nanoseconds, the median over rounds of an all-reduce that all ranks leave together.
int64_t clock_offset_ns(dist::ProcessGroup& group, Device device);

// Collective: aligns this rank's `events` to rank 0's clock, and rank 0 writes every rank's
// into `path` (pid = rank; ember::Error naming the path if it cannot). Returns every rank's
// figures, on every rank.
std::vector<OverlapFigures> write_merged_trace(dist::ProcessGroup& group, Device device,
                                               const std::vector<trace::Event>& events,
                                               const std::string& path);

// The printed figures: a line per rank, then the slowest rank.
std::string overlap_report(const std::vector<OverlapFigures>& ranks);

}  // namespace ember::apps
