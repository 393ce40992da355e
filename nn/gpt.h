// GPT: a decoder-only transformer in nanoGPT's layout (Radford et al. 2019), for language
// models trained with ember's dist layer. Token and position embeddings, pre-norm blocks
// (LayerNorm, causal multi-head self-attention, LayerNorm, a GELU MLP of width 4 * n_embd),
// a final LayerNorm, and an output head tied to the token embedding (logits = x wte^T).
//
// Parameter names follow nanoGPT's (wte, wpe, h.N.ln_1, h.N.attn.c_attn, h.N.attn.c_proj,
// h.N.ln_2, h.N.mlp.c_fc, h.N.mlp.c_proj, ln_f) without its "transformer." prefix; the tied
// head is wte.weight itself, so it appears once in named_parameters() and the optimizer.
#pragma once

#include <memory>
#include <string>

#include <ember/tensor/random.h>

#include "layers.h"

namespace ember::nn {

struct GPTConfig {
  int64_t vocab_size = 0;
  int64_t block_size = 256;  // the longest context
  int64_t n_layer = 6;
  int64_t n_head = 6;
  int64_t n_embd = 384;
  double dropout = 0.0;  // embeddings, attention probabilities and residual branches
  bool bias = true;      // biases in the Linear layers and LayerNorms
};

class GPT : public Module {
 public:
  // Weights as nanoGPT initialises them: N(0, 0.02) for Linear and Embedding weights,
  // N(0, 0.02 / sqrt(2 * n_layer)) for the residual projections (attn.c_proj, mlp.c_proj),
  // zero biases, LayerNorms 1 and 0. ember::Error naming the field for an invalid config.
  explicit GPT(const GPTConfig& config);

  // idx [B, T] (i64 token ids, T <= block_size) -> logits [B, T, vocab_size].
  Tensor forward(const Tensor& idx) override;
  std::string name() const override { return "GPT"; }
  const GPTConfig& config() const { return config_; }

  // Extends idx [B, T] by max_new_tokens tokens, each drawn from the softmax of the last
  // position's logits / temperature, restricted to the top_k most likely (0: all), cropping
  // the context to block_size. Runs in eval mode without autograd; returns [B, T + new].
  // temperature 0 takes the most likely token (greedy).
  Tensor generate(const Tensor& idx, int64_t max_new_tokens, double temperature = 1.0,
                  int64_t top_k = 0, Generator* gen = nullptr);

 private:
  GPTConfig config_;
  std::shared_ptr<Embedding> wte_, wpe_;
  std::shared_ptr<Sequential> h_;  // the blocks
  std::shared_ptr<LayerNorm> ln_f_;
};

// The number of floating-point operations one training step spends per token (forward and
// backward), as nanoGPT's estimate_mfu: 6 * parameters + 12 * n_layer * n_embd * block_size.
double gpt_flops_per_token(const GPT& model, int64_t sequence_length);

}  // namespace ember::nn
