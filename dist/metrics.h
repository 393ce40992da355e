// Metric helpers: averaging named scalars across ranks, and logging from rank 0 only.
#pragma once

#include <iostream>
#include <map>
#include <string>
#include <string_view>

#include "process_group.h"

namespace ember::dist {

// The mean over ranks of each named value, in one all-reduce. Every rank must pass the same
// names; ember::Error (on every rank) when they differ.
std::map<std::string, double> average_across_ranks(const std::map<std::string, double>& values,
                                                   ProcessGroup& group);
// The same over the default group (ember::Error before init_process_group()).
std::map<std::string, double> average_across_ranks(const std::map<std::string, double>& values);

// Writes lines on rank 0 and nowhere else, so a job's output appears once.
class RankZeroLogger {
 public:
  explicit RankZeroLogger(const ProcessGroup& group, std::ostream& out = std::cout)
      : enabled_(group.rank() == 0), out_(out) {}
  // Rank 0 of the default group (ember::Error before init_process_group()).
  explicit RankZeroLogger(std::ostream& out = std::cout);
  bool enabled() const { return enabled_; }
  void log(std::string_view line);
  // "<prefix> name=value name=value ..." with values to 6 significant digits.
  void log_metrics(std::string_view prefix, const std::map<std::string, double>& values);

 private:
  bool enabled_;
  std::ostream& out_;
};

}  // namespace ember::dist
