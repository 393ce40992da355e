#include "../parallel.h"

#include <cblas.h>
#include <omp.h>

#include "../error.h"

namespace ember {

void set_num_threads(int threads) {
  EMBER_CHECK(threads > 0, "set_num_threads", "thread count must be positive, got ", threads);
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
}

int get_num_threads() { return omp_get_max_threads(); }

}  // namespace ember
