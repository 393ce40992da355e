// CPU memory: the table's allocator entry, the host allocator (tensor/allocator.h). The CPU
// needs no `transfer` (the CUDA table copies between the host and its devices).
#include "../allocator.h"
#include "cpu_kernels.h"

namespace ember::detail {

EMBER_REGISTER_CPU_KERNELS(memory) {
  table.allocator = [](int) { return &cpu_allocator(); };
}

}  // namespace ember::detail
