// Scaled-dot-product attention, as torch.nn.functional.scaled_dot_product_attention (without
// attn_mask): one fused, differentiable op that never holds the L_q x L_k score matrix.
// Also reachable as ember::nn::functional::scaled_dot_product_attention (nn/functional.h).
#pragma once

#include <optional>
#include <type_traits>

#include "random.h"
#include "tensor.h"

namespace ember {

// softmax(query @ key^T * scale + mask) @ value, with dropout on the attention weights.
//   query [..., L_q, E], key [..., L_k, E], value [..., L_k, E_v] -> [..., L_q, E_v]; the
//   leading dims (usually [B, H]) must be equal in all three, dtypes and devices too.
//   is_causal: query i attends to keys j <= i (PyTorch's top-left aligned causal mask).
//   dropout_p: each attention weight is zeroed with probability dropout_p and the rest scaled
//     by 1 / (1 - dropout_p); pass 0 in eval. With 0 no random number is drawn; otherwise one
//     draw of `gen` (the default generator when null) decides the whole mask.
//   scale: defaults to 1 / sqrt(E).
// NOTE: the mask of a draw (seed, offset) keeps weight (b, i, j) (b the flat index of the
// leading dims) exactly where rand({..., L_q, L_k}, kF32) drawn at (seed, offset) is below
// float(1 - dropout_p), on the CPU and CUDA alike; backward regenerates it from (seed, offset).
// CPU: a tiled (flash-attention) kernel on BLAS, threads over the leading dims and query
// blocks; CUDA: ember's own kernels, a FlashAttention-2 style tensor-core one for f16/bf16 at
// head dims 64 and 128 on sm_80+, a simple one otherwise (EMBER_SDPA_CUDA_KERNEL=simple|
// tensor_core picks; tensor/cuda/attention.cu). f32 and f64 compute in their dtype, f16/bf16
// in f32 with the output rounded once. Under autocast it runs in the low dtype (PyTorch's
// CUDA list).
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    bool is_causal = false, double dropout_p = 0.0,
                                    std::optional<double> scale = std::nullopt,
                                    Generator* gen = nullptr);

// PyTorch's fourth argument is attn_mask and its fifth dropout_p, so a call written from
// PyTorch code such as scaled_dot_product_attention(q, k, v, 0.1) would otherwise turn 0.1
// into is_causal = true. A number in the fourth place does not compile; name it instead:
// scaled_dot_product_attention(q, k, v, /*is_causal=*/false, /*dropout_p=*/0.1).
template <typename NotABool>
requires(!std::is_same_v<NotABool, bool>) Tensor
    scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                 NotABool is_causal, double dropout_p = 0.0,
                                 std::optional<double> scale = std::nullopt,
                                 Generator* gen = nullptr)
= delete;

}  // namespace ember
