#include "amp.h"

#include <utility>

#include "detail/default_group.h"

namespace ember::dist {

optim::GradScaler::FoundInfReducer make_found_inf_agreement(std::shared_ptr<ProcessGroup> group) {
  EMBER_CHECK(group != nullptr, "make_found_inf_agreement", "the process group is null");
  return [group = std::move(group)](const Tensor& found_inf) {
    group->allreduce(found_inf, ReduceOp::kMax)->wait();
  };
}

optim::GradScaler::FoundInfReducer make_found_inf_agreement() {
  return make_found_inf_agreement(detail::default_group_for("make_found_inf_agreement"));
}

}  // namespace ember::dist
