#include "kernel_table.h"

namespace ember::detail {
namespace {

// Constant-initialised, so a kernel file's registration finds it whatever the order in which
// the files' start-up code runs.
constinit KernelTable tables[kNumDeviceTypes];

}  // namespace

const KernelTable& kernel_table(DeviceType type) { return tables[static_cast<int>(type)]; }

KernelTable& kernel_table_to_fill(DeviceType type) { return tables[static_cast<int>(type)]; }

}  // namespace ember::detail
