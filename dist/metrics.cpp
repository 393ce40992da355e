#include "metrics.h"

#include <sstream>
#include <vector>

#include <ember/tensor/ops.h>

#include "detail/default_group.h"

namespace ember::dist {

std::map<std::string, double> average_across_ranks(const std::map<std::string, double>& values,
                                                   ProcessGroup& group) {
  // The last slot carries a 32-bit hash of the names: summed over ranks it is world * hash
  // (exact in f64) only when every rank has the same names.
  uint32_t hash = 2166136261u;
  std::vector<double> packed;
  for (const auto& [name, value] : values) {
    for (char c : name) hash = (hash ^ static_cast<unsigned char>(c)) * 16777619u;
    hash = (hash ^ 0xffu) * 16777619u;
    packed.push_back(value);
  }
  packed.push_back(static_cast<double>(values.size()));
  packed.push_back(static_cast<double>(hash));
  Tensor t =
      from_vector<double>(packed, {static_cast<int64_t>(packed.size())}).to(group.tensor_device());
  const size_t n = values.size();
  group.allreduce(t, ReduceOp::kSum)->wait();
  const std::vector<double> sums = t.to_vector<double>();  // ordered after the all-reduce
  const double world = group.size();
  EMBER_CHECK(
      sums[n] == world * static_cast<double>(n) && sums[n + 1] == world * static_cast<double>(hash),
      "average_across_ranks", "the value names on rank ", group.rank(),
      " differ from another rank's");
  std::map<std::string, double> out;
  size_t i = 0;
  for (const auto& [name, value] : values) out[name] = sums[i++] / world;
  return out;
}

std::map<std::string, double> average_across_ranks(const std::map<std::string, double>& values) {
  return average_across_ranks(values, *detail::default_group_for("average_across_ranks"));
}

RankZeroLogger::RankZeroLogger(std::ostream& out)
    : RankZeroLogger(*detail::default_group_for("RankZeroLogger"), out) {}

void RankZeroLogger::log(std::string_view line) {
  if (enabled_) out_ << line << '\n' << std::flush;
}

void RankZeroLogger::log_metrics(std::string_view prefix,
                                 const std::map<std::string, double>& values) {
  if (!enabled_) return;
  std::ostringstream line;
  line.precision(6);
  line << prefix;
  for (const auto& [name, value] : values) line << ' ' << name << '=' << value;
  log(line.str());
}

}  // namespace ember::dist
