#include "../parallel.h"

#include <cblas.h>
#include <omp.h>
#include <sched.h>

#include <algorithm>

#include "../error.h"

namespace ember {

void set_num_threads(int threads) {
  EMBER_CHECK(threads > 0, "set_num_threads", "thread count must be positive, got ", threads);
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
}

int get_num_threads() { return omp_get_max_threads(); }

int available_cpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) == 0) return std::max(1, CPU_COUNT(&mask));
  return std::max(1, omp_get_num_procs());  // a mask wider than cpu_set_t: all the CPUs
}

int cpu_share(int processes) {
  EMBER_CHECK(processes > 0, "cpu_share", "process count must be positive, got ", processes);
  return std::max(1, available_cpus() / processes);
}

}  // namespace ember
