#include "kernel_table.h"

#include <ember/config.h>

namespace ember::detail {

const KernelTable& kernel_table(DeviceType type) {
  static const KernelTable* const tables = [] {
    static KernelTable all[kNumDeviceTypes];
    register_cpu_kernels(all[static_cast<int>(DeviceType::kCPU)]);
    register_cuda_kernels(all[static_cast<int>(DeviceType::kCUDA)]);
    return all;
  }();
  return tables[static_cast<int>(type)];
}

}  // namespace ember::detail
