// The CUDA kernel files each fill their part of the kernel table. Private to tensor/cuda/.
#pragma once

#include "../detail/kernel_table.h"

#if defined(EMBER_CUDA_EMULATED)
namespace ember::detail::emulated {  // the emulated copies (device.cuh)
#else
namespace ember::detail {
#endif

void register_cuda_elementwise_kernels(KernelTable& table);  // fill, copy, unary, binary, where
void register_cuda_reduce_kernels(KernelTable& table);       // reduce, arg_reduce, softmax
void register_cuda_index_kernels(KernelTable& table);        // index_select, gather, scatter_add
void register_cuda_random_kernels(KernelTable& table);       // random
void register_cuda_linalg_kernels(KernelTable& table);         // gemm
void register_cuda_memory_kernels(KernelTable& table);       // allocator, transfer
void register_cuda_conv_kernels(KernelTable& table);         // conv2d (cuDNN)
void register_cuda_layer_kernels(KernelTable& table);        // batch norm, cross-entropy
void register_cuda_amp_kernels(KernelTable& table);          // amp_non_finite_check_and_unscale
// scaled-dot-product attention
void register_cuda_attention_kernels(KernelTable& table);  // attention_forward, attention_backward
// GPT layers
void register_cuda_layer_norm_kernels(KernelTable& table);  // layer_norm_forward/backward
// Pooling (max, average, adaptive average; NCHW and channels_last).
void register_cuda_pooling_kernels(KernelTable& table);

}  // namespace ember::detail
