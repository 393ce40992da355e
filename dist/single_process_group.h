// World size 1 without MPI or NCCL: every collective leaves its tensor as it is (or copies
// it where the result lands elsewhere) and is complete on return; send/recv have no peer
// (they throw ember::Error). new_group({0}) gives another such group.
#pragma once

#include <ember/dist/process_group.h>

namespace ember::dist {

class SingleProcessGroup : public BackendGroup {
 public:
  SingleProcessGroup() : BackendGroup(0, 1, 0) {}

  std::string backend() const override { return "single"; }

 private:
  WorkHandle submit(const CollectiveRequest& request) override;
  std::shared_ptr<ProcessGroup> make_subgroup(const SubgroupSpec& spec) override;
};

}  // namespace ember::dist
