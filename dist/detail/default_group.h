// The default process group that init_process_group sets and the free functions of api.h use.
#pragma once

#include <memory>

#include <ember/dist/process_group.h>

namespace ember::dist::detail {

// The default group; ember::Error naming `op` when there is none ("all_reduce: the default
// process group is not initialized; call init_process_group() first").
std::shared_ptr<ProcessGroup> default_group_for(const char* op);

}  // namespace ember::dist::detail
