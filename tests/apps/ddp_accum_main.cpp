// Under mpirun -np 2: ember-train's Trainer with --accum-steps 4 inside DDP (no_sync on the
// first 3 micro-batches) takes the same steps as without accumulation, and as one process
// stepping on both ranks' batches together. Exit code 0 when they agree.
#include <cmath>
#include <cstdio>

#include <ember/dist/ddp.h>
#include <ember/dist/init.h>
#include <ember/dist/single_process_group.h>
#include <ember/ember.h>

#include "small_model.h"
#include "trainer.h"

using namespace ember;
using apps::testing::flat_parameters;
using apps::testing::make_sgd;
using apps::testing::small_model;

namespace {
// Both ranks' batches of step `step`: [2 * 16, 8]; rank r takes rows 16r .. 16r + 15.
data::Batch global_batch(uint64_t step) {
  manual_seed(1000 + step);
  data::Batch b;
  b.data = randn({32, 8});
  b.target = randint(0, 3, {32});
  return b;
}
double max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double d = a.size() == b.size() ? 0 : 1e30;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
  return d;
}
}  // namespace

int main() {
  auto group = dist::init_process_group();
  if (group->size() != 2) {
    std::fprintf(stderr, "ddp_accum: run under mpirun -np 2 (got %d ranks)\n", group->size());
    return 2;
  }
  const int rank = group->rank();
  apps::TrainOptions whole, split, reference_options;
  split.accum_steps = 4;
  auto model_a = small_model(), model_b = small_model(), reference = small_model();
  auto ddp_a = std::make_shared<dist::DistributedDataParallel>(model_a, group);
  auto ddp_b = std::make_shared<dist::DistributedDataParallel>(model_b, group);
  auto sgd_a = make_sgd(*model_a), sgd_b = make_sgd(*model_b), sgd_ref = make_sgd(*reference);
  dist::SingleProcessGroup alone;
  apps::Trainer a(whole, *model_a, *ddp_a, *sgd_a, nullptr, *group, kCPU);
  apps::Trainer b(split, *model_b, *ddp_b, *sgd_b, nullptr, *group, kCPU);
  apps::Trainer ref(reference_options, *reference, *reference, *sgd_ref, nullptr, alone, kCPU);
  for (uint64_t step = 0; step < 3; ++step) {
    const data::Batch all = global_batch(step);
    data::Batch mine;
    mine.data = all.data.narrow(0, 16 * rank, 16);
    mine.target = all.target.narrow(0, 16 * rank, 16);
    a.run_batch(mine);
    b.run_batch(mine);
    ref.run_batch(all);
  }
  const double ab = max_difference(flat_parameters(*model_a), flat_parameters(*model_b));
  const double a_ref = max_difference(flat_parameters(*model_a), flat_parameters(*reference));
  const double b_ref = max_difference(flat_parameters(*model_b), flat_parameters(*reference));
  std::printf(
      "rank %d: |accum 1 - accum 4| = %.3g, |accum 1 - one process| = %.3g, "
      "|accum 4 - one process| = %.3g\n",
      rank, ab, a_ref, b_ref);
  const bool ok = ab < 1e-5 && a_ref < 1e-5 && b_ref < 1e-5;
  if (!ok) std::fprintf(stderr, "rank %d: accumulation under DDP changed the steps\n", rank);
  return ok ? 0 : 1;
}
