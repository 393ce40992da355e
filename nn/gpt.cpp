#include "gpt.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "attention.h"
#include "init.h"
#include "layers.h"

namespace ember::nn {

namespace {

// The feed-forward half of a block: c_proj(gelu(c_fc(x))), then residual dropout.
class Mlp : public Module {
 public:
  Mlp(const GPTConfig& c) : dropout_(c.dropout) {
    c_fc_ = register_module("c_fc", std::make_shared<Linear>(c.n_embd, 4 * c.n_embd, c.bias));
    c_proj_ = register_module("c_proj", std::make_shared<Linear>(4 * c.n_embd, c.n_embd, c.bias));
  }
  Tensor forward(const Tensor& x) override {
    return dropout((*c_proj_)(gelu((*c_fc_)(x))), dropout_, is_training());
  }
  std::string name() const override { return "Mlp"; }

 private:
  std::shared_ptr<Linear> c_fc_, c_proj_;
  double dropout_;
};

// x + attn(ln_1(x)), then x + mlp(ln_2(x)).
class Block : public Module {
 public:
  explicit Block(const GPTConfig& c) {
    ln_1_ = register_module(
        "ln_1", std::make_shared<LayerNorm>(c.n_embd, LayerNormOptions{.bias = c.bias}));
    attn_ = register_module("attn", std::make_shared<MultiheadSelfAttention>(
                                        c.n_embd, c.n_head, c.bias, c.dropout, /*causal=*/true));
    ln_2_ = register_module(
        "ln_2", std::make_shared<LayerNorm>(c.n_embd, LayerNormOptions{.bias = c.bias}));
    mlp_ = register_module("mlp", std::make_shared<Mlp>(c));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor y = x + (*attn_)((*ln_1_)(x));
    return y + (*mlp_)((*ln_2_)(y));
  }
  std::string name() const override { return "Block"; }

 private:
  std::shared_ptr<LayerNorm> ln_1_, ln_2_;
  std::shared_ptr<MultiheadSelfAttention> attn_;
  std::shared_ptr<Mlp> mlp_;
};

}  // namespace

GPT::GPT(const GPTConfig& config) : config_(config) {
  const GPTConfig& c = config;
  EMBER_CHECK(c.vocab_size > 0, "GPT", "vocab_size must be positive, got ", c.vocab_size);
  EMBER_CHECK(c.block_size > 0, "GPT", "block_size must be positive, got ", c.block_size);
  EMBER_CHECK(c.n_layer > 0, "GPT", "n_layer must be positive, got ", c.n_layer);
  EMBER_CHECK(c.n_head > 0 && c.n_embd > 0 && c.n_embd % c.n_head == 0, "GPT", "n_embd (", c.n_embd,
              ") must be a positive multiple of n_head (", c.n_head, ")");
  EMBER_CHECK(c.dropout >= 0.0 && c.dropout < 1.0, "GPT", "dropout must be in [0, 1), got ",
              c.dropout);
  wte_ = register_module("wte", std::make_shared<Embedding>(c.vocab_size, c.n_embd));
  wpe_ = register_module("wpe", std::make_shared<Embedding>(c.block_size, c.n_embd));
  h_ = register_module("h", std::make_shared<Sequential>());
  for (int64_t i = 0; i < c.n_layer; ++i) h_->push_back(std::make_shared<Block>(c));
  ln_f_ = register_module("ln_f",
                          std::make_shared<LayerNorm>(c.n_embd, LayerNormOptions{.bias = c.bias}));

  NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  for (auto& [name, p] : named_parameters()) {
    const bool is_weight = name.ends_with(".weight") && p.dim() == 2;
    if (is_weight) {
      init::normal_(p, 0.0, name.ends_with("c_proj.weight") ? residual_std : 0.02);
    } else if (name.ends_with(".bias")) {
      init::zeros_(p);
    }
  }
}

Tensor GPT::forward(const Tensor& idx) {
  EMBER_CHECK(idx.dim() == 2 && idx.dtype() == kI64, "GPT",
              "expected token ids [B, T] of i64, got ", shape_str(idx.sizes()), " of ",
              idx.dtype());
  const int64_t t = idx.size(1);
  EMBER_CHECK(t >= 1 && t <= config_.block_size, "GPT", "a sequence of ", t,
              " tokens does not fit block_size ", config_.block_size);
  const Tensor pos = arange(t, TensorOptions(kI64, idx.device()));
  Tensor x = dropout((*wte_)(idx) + (*wpe_)(pos), config_.dropout, is_training());
  x = (*ln_f_)((*h_)(x));
  return linear(x, wte_->weight);  // the head tied to the token embedding
}

Tensor GPT::generate(const Tensor& idx, int64_t max_new_tokens, double temperature, int64_t top_k,
                     Generator* gen) {
  EMBER_CHECK(max_new_tokens >= 0, "GPT::generate", "max_new_tokens must be >= 0, got ",
              max_new_tokens);
  EMBER_CHECK(temperature >= 0.0, "GPT::generate", "temperature must be >= 0, got ", temperature);
  EMBER_CHECK(top_k >= 0, "GPT::generate", "top_k must be >= 0, got ", top_k);
  const bool was_training = is_training();
  eval();
  NoGradGuard no_grad;
  Tensor out = idx;
  const int64_t batch = idx.size(0), vocab = config_.vocab_size;
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    const int64_t t = out.size(1), keep = std::min(t, config_.block_size);
    const Tensor logits = forward(out.narrow(1, t - keep, keep)).select(1, keep - 1);
    const std::vector<double> z = logits.to(kCPU).to(kF64).contiguous().to_vector<double>();
    const std::vector<double> u = uniform({batch}, 0.0, 1.0, kF64, gen).to_vector<double>();
    std::vector<int64_t> next(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) {
      const double* row = z.data() + b * vocab;
      std::vector<int64_t> order(static_cast<size_t>(vocab));
      std::iota(order.begin(), order.end(), 0);
      // Most likely first; ties keep the lower id, so greedy decoding is deterministic.
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t c) { return row[a] > row[c]; });
      const int64_t k = top_k > 0 ? std::min(top_k, vocab) : vocab;
      if (temperature == 0.0) {
        next[static_cast<size_t>(b)] = order[0];
        continue;
      }
      std::vector<double> p(static_cast<size_t>(k));
      for (int64_t i = 0; i < k; ++i)
        p[static_cast<size_t>(i)] = std::exp((row[order[i]] - row[order[0]]) / temperature);
      const double total = std::accumulate(p.begin(), p.end(), 0.0);
      double target = u[static_cast<size_t>(b)] * total, cumulative = 0.0;
      int64_t pick = k - 1;
      for (int64_t i = 0; i < k; ++i) {
        cumulative += p[static_cast<size_t>(i)];
        if (target < cumulative) {
          pick = i;
          break;
        }
      }
      next[static_cast<size_t>(b)] = order[pick];
    }
    const Tensor column = from_vector<int64_t>(next).view({batch, 1}).to(idx.device());
    out = cat({out, column}, 1);
  }
  train(was_training);
  return out;
}

double gpt_flops_per_token(const GPT& model, int64_t sequence_length) {
  const GPTConfig& c = model.config();
  return 6.0 * static_cast<double>(parameter_count(model)) +
         12.0 * static_cast<double>(c.n_layer * c.n_embd * sequence_length);
}

}  // namespace ember::nn
