// Loss scaling under data parallelism: every rank must skip the same optimizer steps, or the
// replicas drift apart. GradScaler (optim/, which knows nothing of dist) takes a hook that
// agrees its found-inf flag across processes; this is dist's.
//
//   dist::init_process_group();
//   optim::GradScaler scaler({}, dist::make_found_inf_agreement());  // the default group
#pragma once

#include <memory>

#include <ember/optim/grad_scaler.h>

#include "process_group.h"

namespace ember::dist {

// A FoundInfReducer: a max all-reduce of the found-inf flag over `group`, waited on, so that a
// step one rank skips is skipped by all (and the scale backs off everywhere). Every rank calls
// it in the same order, once per gradient device and unscale. The flag sits on the gradients'
// device: NCCL groups take CUDA gradients, MPI and TCP groups CPU ones (or stage CUDA).
optim::GradScaler::FoundInfReducer make_found_inf_agreement(std::shared_ptr<ProcessGroup> group);
// The same over the default group, taken now (ember::Error before init_process_group()).
optim::GradScaler::FoundInfReducer make_found_inf_agreement();

}  // namespace ember::dist
