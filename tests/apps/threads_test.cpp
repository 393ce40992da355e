// ember-train --threads: 0 under a launcher means this rank's share of the node's CPUs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include <ember/ember.h>

#include "train_options.h"

namespace ember::apps {
namespace {

using Variables = std::map<std::string, std::string>;

// Sets the launch variables threads_to_set reads to `values` (unsets those not given),
// restoring them at the end.
class LaunchEnvironment {
 public:
  explicit LaunchEnvironment(const Variables& values) {
    for (const char* name :
         {"OMP_NUM_THREADS", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
      const char* old = std::getenv(name);
      saved_[name] = old != nullptr ? std::optional<std::string>(old) : std::nullopt;
      const auto it = values.find(name);
      set(name, it != values.end() ? std::optional<std::string>(it->second) : std::nullopt);
    }
  }
  LaunchEnvironment(const LaunchEnvironment&) = delete;
  LaunchEnvironment& operator=(const LaunchEnvironment&) = delete;
  ~LaunchEnvironment() {
    for (const auto& [name, value] : saved_) set(name, value);
  }

 private:
  static void set(const std::string& name, const std::optional<std::string>& value) {
    if (value) {
      ::setenv(name.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

TEST(Threads, ZeroMeansTheRanksShareUnderALauncher) {
  {
    LaunchEnvironment alone(Variables{});
    EXPECT_EQ(threads_to_set(0), 0) << "one process: OpenMP's count (all CPUs)";
    EXPECT_EQ(threads_to_set(3), 3);
  }
  {
    LaunchEnvironment torchrun(Variables{{"LOCAL_WORLD_SIZE", "2"}});  // ember-run, torchrun
    EXPECT_EQ(threads_to_set(0), cpu_share(2));
    EXPECT_EQ(threads_to_set(5), 5) << "--threads N wins";
  }
  {
    LaunchEnvironment mpirun(Variables{{"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}});
    EXPECT_EQ(threads_to_set(0), cpu_share(3));
  }
  {
    LaunchEnvironment mpich(Variables{{"MPI_LOCALNRANKS", "1000"}});
    EXPECT_EQ(threads_to_set(0), 1) << "at least one thread";
  }
  {
    // The user's OMP_NUM_THREADS (or ember-run's) is what OpenMP already follows.
    LaunchEnvironment user(Variables{{"OMP_NUM_THREADS", "3"}, {"LOCAL_WORLD_SIZE", "2"}});
    EXPECT_EQ(threads_to_set(0), 0);
  }
  {
    LaunchEnvironment empty(Variables{{"OMP_NUM_THREADS", ""}, {"LOCAL_WORLD_SIZE", "2"}});
    EXPECT_EQ(threads_to_set(0), cpu_share(2)) << "an empty OMP_NUM_THREADS is unset";
  }
}

}  // namespace
}  // namespace ember::apps
