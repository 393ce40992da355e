// ember-train --model gpt: a GPT (nn::GPT) on text (data::CharDataset / ByteDataset), and
// `ember-train sample`, which continues a prompt from a snapshot.
//
// Snapshots of a GPT run carry what sampling needs besides the weights, in the checkpoint's
// texts: the model's shape ("gpt.n_layer", ... as decimal strings) and the vocabulary
// ("gpt.tokens": "char" or "byte"; "gpt.vocabulary": the characters in id order as UTF-8).
#pragma once

#include <map>
#include <memory>
#include <string>

#include <ember/data/text.h>
#include <ember/nn/gpt.h>

#include "data_setup.h"
#include "train_options.h"

namespace ember::apps {

// The corpus: options.data as a text file or a folder of them (every regular file in it,
// sorted), or Debian's fortunes when options.data is "fortunes". Tokens by options.tokens
// ("char" or "byte"). The last 10% of the tokens are the validation split (nanoGPT's): train
// windows lie wholly before it, test windows wholly in it. classes = the vocabulary's size.
DataSplits load_text_data(const TrainOptions& options);

// The GPT that options describe over a vocabulary of vocab_size tokens.
nn::GPTConfig gpt_config(const TrainOptions& options, int64_t vocab_size);

// What a snapshot records about the model and its vocabulary (see the top of this file).
std::map<std::string, std::string> gpt_texts(const nn::GPTConfig& config,
                                             const data::TextVocabulary& vocabulary);

// A GPT and its vocabulary rebuilt from a snapshot file, its weights loaded, on `device`.
struct SnapshotGPT {
  std::shared_ptr<nn::GPT> model;
  data::TextVocabulary vocabulary = data::TextVocabulary::bytes();
};
SnapshotGPT load_gpt_snapshot(const std::string& path, Device device);

// `ember-train sample`: prints options.prompt continued by options.tokens tokens.
int run_sample(const SampleOptions& options);

}  // namespace ember::apps
