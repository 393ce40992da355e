#include "cpu_kernels.h"

namespace ember::detail {

void register_cpu_kernels(KernelTable& table) {
  register_cpu_memory_kernels(table);
  register_cpu_elementwise_kernels(table);
  register_cpu_random_kernels(table);
  register_cpu_reduce_kernels(table);
  register_cpu_linalg_kernels(table);
  register_cpu_index_kernels(table);
  register_cpu_conv_kernels(table);
  register_cpu_layer_kernels(table);
  register_cpu_layer_norm_kernels(table);
  register_cpu_amp_kernels(table);
  // scaled-dot-product attention
  register_cpu_attention_kernels(table);
  register_cpu_pooling_kernels(table);
}

}  // namespace ember::detail
