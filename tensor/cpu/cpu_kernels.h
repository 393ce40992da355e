// The CPU kernel files each fill their part of the kernel table.
#pragma once

#include "../detail/kernel_table.h"

namespace ember::detail {

void register_cpu_memory_kernels(KernelTable& table);       // allocator
void register_cpu_elementwise_kernels(KernelTable& table);  // fill, copy, unary, binary, where
void register_cpu_random_kernels(KernelTable& table);       // random
void register_cpu_reduce_kernels(KernelTable& table);       // reduce, arg_reduce, softmax
void register_cpu_linalg_kernels(KernelTable& table);       // gemm
void register_cpu_index_kernels(KernelTable& table);        // index_select, gather, scatter_add
void register_cpu_conv_kernels(KernelTable& table);         // conv2d_forward, conv2d_backward
void register_cpu_layer_kernels(KernelTable& table);        // batch norm, cross-entropy
void register_cpu_layer_norm_kernels(KernelTable& table);   // layer_norm_forward/backward
void register_cpu_amp_kernels(KernelTable& table);          // amp_non_finite_check_and_unscale
// scaled-dot-product attention
void register_cpu_attention_kernels(KernelTable& table);  // attention_forward, attention_backward
// Pooling (max, average, adaptive average; NCHW and channels_last).
void register_cpu_pooling_kernels(KernelTable& table);

// Splits [0, n) across OpenMP threads when n elements are worth it (a grain of work each).
inline constexpr int64_t kParallelGrain = 32768;

}  // namespace ember::detail
