#include "amp.h"

#include <utility>

namespace ember::dist {

optim::GradScaler::FoundInfReducer make_found_inf_agreement(std::shared_ptr<ProcessGroup> group) {
  EMBER_CHECK(group != nullptr, "make_found_inf_agreement", "the process group is null");
  return [group = std::move(group)](const Tensor& found_inf) {
    group->allreduce(found_inf, ReduceOp::kMax)->wait();
  };
}

}  // namespace ember::dist
