// Fills the CUDA column of the kernel table.
#include "cuda_kernels.h"

namespace ember::detail {

void register_cuda_kernels(KernelTable& table) {
  register_cuda_memory_kernels(table);
  register_cuda_elementwise_kernels(table);
  register_cuda_reduce_kernels(table);
  register_cuda_index_kernels(table);
  register_cuda_random_kernels(table);
  register_cuda_linalg_kernels(table);
  register_cuda_conv_kernels(table);
  register_cuda_layer_kernels(table);
  register_cuda_amp_kernels(table);
  // scaled-dot-product attention
  register_cuda_attention_kernels(table);
  register_cuda_layer_norm_kernels(table);  // GPT layers
  register_cuda_pooling_kernels(table);
}

}  // namespace ember::detail
