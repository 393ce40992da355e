// Which parameters take weight decay: nanoGPT's and minGPT's configure_optimizers as helpers.
//
//   optim::AdamW opt(optim::weight_decay_groups(*model, 0.1), {.lr = 6e-4, .betas = {0.9, 0.95}});
//
// Two rules, named after the code they follow:
//   - WeightDecayRule::kNanoGPT (the default): nanoGPT's configure_optimizers. Every
//     parameter of 2 or more dims decays (Linear and Conv2d weights, the embeddings wte and
//     wpe, any matrix); every other one (biases, norm weights, gains) does not.
//   - WeightDecayRule::kMinGPT: minGPT's configure_optimizers, by module type (Module::name())
//     and parameter shape, so it holds for modules written later without listing them here:
//       - a parameter named "bias" does not decay;
//       - nor do the parameters of a module whose name() is in `no_decay_modules` (by
//         default the normalisation and embedding layers: LayerNorm, BatchNorm1d,
//         BatchNorm2d, SyncBatchNorm, GroupNorm, Embedding);
//       - nor does any other parameter of fewer than 2 dims;
//       - every other parameter decays.
// The two differ on a GPT's embeddings (and on any matrix a norm or embedding module holds):
// one AdamW step moves wte and wpe by lr * weight_decay more under nanoGPT's rule.
// A parameter shared by several modules (tied embedding and output weights) is listed once,
// under its first name, and decays only if every module holding it says so. Parameters that
// do not require grad (frozen) are left out, as the optimizer would refuse them.
#pragma once

#include <string>
#include <vector>

#include <ember/nn/module.h>

#include "optimizer.h"

namespace ember::optim {

enum class WeightDecayRule { kNanoGPT, kMinGPT };

struct WeightDecaySplit {
  nn::NamedTensors decay;  // dotted names, in named_parameters() order
  nn::NamedTensors no_decay;
};

// {"LayerNorm", "BatchNorm1d", "BatchNorm2d", "SyncBatchNorm", "GroupNorm", "Embedding"}.
const std::vector<std::string>& default_no_decay_modules();

// The parameters of `model` sorted by `rule` (kMinGPT with default_no_decay_modules()).
WeightDecaySplit split_weight_decay(nn::Module& model,
                                    WeightDecayRule rule = WeightDecayRule::kNanoGPT);
// minGPT's rule with another list of module types that never decay.
WeightDecaySplit split_weight_decay(nn::Module& model,
                                    const std::vector<std::string>& no_decay_modules);

// Optimizer groups of the split: {decay params, {{"weight_decay", weight_decay}}} then
// {no-decay params, {{"weight_decay", 0}}}; a group with no parameter is left out (the
// optimizer refuses empty groups). Other options come from the optimizer's defaults.
std::vector<ParamGroup> weight_decay_groups(nn::Module& model, double weight_decay,
                                            WeightDecayRule rule = WeightDecayRule::kNanoGPT);
std::vector<ParamGroup> weight_decay_groups(nn::Module& model, double weight_decay,
                                            const std::vector<std::string>& no_decay_modules);

}  // namespace ember::optim
