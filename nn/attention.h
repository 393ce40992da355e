// Multi-head self-attention in minGPT's CausalSelfAttention shape.
#pragma once

#include <ember/tensor/attention.h>

#include "layers.h"
#include "module.h"

namespace ember::nn {

// x [B, L, E] -> [B, L, E]: one projection c_attn (Linear E -> 3E) gives q, k and v, split
// into num_heads heads of E / num_heads; scaled_dot_product_attention (causal when `causal`,
// its weights dropped with probability `dropout` in training); the heads joined and projected
// by c_proj (Linear E -> E); then residual dropout (resid_dropout, same p). Parameter names
// are minGPT's (c_attn.weight [3E, E], c_attn.bias, c_proj.weight [E, E], c_proj.bias), so
// its state dict loads; minGPT's causal-mask buffer "bias" has no counterpart (`causal` does
// its work). Dropout draws from `gen` (the default generator when null).
class MultiheadSelfAttention : public Module {
 public:
  MultiheadSelfAttention(int64_t embed_dim, int64_t num_heads, bool bias = true,
                         double dropout = 0.0, bool causal = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "MultiheadSelfAttention"; }

  int64_t embed_dim() const { return embed_dim_; }
  int64_t num_heads() const { return num_heads_; }
  bool causal() const { return causal_; }

  std::shared_ptr<Linear> c_attn, c_proj;
  std::shared_ptr<Dropout> resid_dropout;

 private:
  int64_t embed_dim_, num_heads_;
  double dropout_;
  bool causal_;
  Generator* gen_;
};

}  // namespace ember::nn
