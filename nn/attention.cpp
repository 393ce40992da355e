#include "attention.h"

namespace ember::nn {

MultiheadSelfAttention::MultiheadSelfAttention(int64_t embed_dim, int64_t num_heads, bool bias,
                                               double dropout, bool causal, Generator* gen)
    : embed_dim_(embed_dim), num_heads_(num_heads), dropout_(dropout), causal_(causal), gen_(gen) {
  EMBER_CHECK(embed_dim > 0 && num_heads > 0, "MultiheadSelfAttention",
              "embed_dim and num_heads must be positive, got ", embed_dim, " and ", num_heads);
  EMBER_CHECK(embed_dim % num_heads == 0, "MultiheadSelfAttention", "embed_dim ", embed_dim,
              " is not divisible by num_heads ", num_heads);
  EMBER_CHECK(dropout >= 0.0 && dropout <= 1.0, "MultiheadSelfAttention",
              "dropout must be in [0, 1], got ", dropout);
  c_attn = register_module("c_attn", std::make_shared<Linear>(embed_dim, 3 * embed_dim, bias));
  c_proj = register_module("c_proj", std::make_shared<Linear>(embed_dim, embed_dim, bias));
  resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(dropout, gen));
}

Tensor MultiheadSelfAttention::forward(const Tensor& x) {
  EMBER_CHECK(x.dim() == 3 && x.size(2) == embed_dim_, "MultiheadSelfAttention",
              "expected an input [B, L, ", embed_dim_, "], got ", shape_str(x.sizes()));
  const int64_t batch = x.size(0), length = x.size(1), head_dim = embed_dim_ / num_heads_;
  const Tensor qkv = (*c_attn)(x);
  // [B, L, E] -> [B, H, L, E / H]
  const auto heads = [&](int64_t part) {
    return qkv.narrow(2, part * embed_dim_, embed_dim_)
        .view({batch, length, num_heads_, head_dim})
        .transpose(1, 2);
  };
  const Tensor y = scaled_dot_product_attention(heads(0), heads(1), heads(2), causal_,
                                                is_training() ? dropout_ : 0.0, std::nullopt, gen_);
  const Tensor joined = y.transpose(1, 2).reshape({batch, length, embed_dim_});
  return (*resid_dropout)((*c_proj)(joined));
}

}  // namespace ember::nn
