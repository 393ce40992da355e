#include "gpt_setup.h"

#include <cstdio>
#include <filesystem>
#include <numeric>

#include <ember/dist/checkpoint.h>
#include <ember/ember.h>

namespace fs = std::filesystem;

namespace ember::apps {

namespace {

std::vector<std::string> corpus_files(const std::string& data) {
  if (data == "fortunes") return data::fortune_files();
  if (!fs::is_directory(data)) return {data};  // the dataset names what is wrong with it
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(data))
    if (entry.is_regular_file()) files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  EMBER_CHECK(!files.empty(), "ember-train", "--data ", data, " holds no regular file");
  return files;
}

int64_t text_int(const std::map<std::string, std::string>& texts, const std::string& key,
                 const std::string& path) {
  const auto it = texts.find(key);
  EMBER_CHECK(it != texts.end(), "ember-train sample", path, " is not a GPT snapshot (no ", key,
              ")");
  size_t used = 0;
  int64_t value = -1;
  try {
    value = std::stoll(it->second, &used);
  } catch (const std::exception&) {
  }
  EMBER_CHECK(used == it->second.size() && value > 0 && value <= (int64_t{1} << 24),
              "ember-train sample", path, ": ", key, " = \"", it->second,
              "\" is not a positive size");
  return value;
}

}  // namespace

DataSplits load_text_data(const TrainOptions& o) {
  const std::vector<std::string> files = corpus_files(o.data);
  std::shared_ptr<data::TextDataset> text;
  if (o.tokens == "byte") {
    text = std::make_shared<data::ByteDataset>(files, o.block_size);
  } else {
    text = std::make_shared<data::CharDataset>(files, o.block_size);
  }
  const int64_t tokens = text->num_tokens(), split = tokens - tokens / 10;
  EMBER_CHECK(split - o.block_size > 0 && text->size() > split, "ember-train", "the corpus (",
              tokens, " tokens) is too short for --block-size ", o.block_size,
              ": 90% for training and 10% for validation must each hold a window of ",
              o.block_size + 1, " tokens");
  DataSplits d;
  d.name = o.data == "fortunes" ? "fortunes" : fs::path(o.data).filename().string();
  d.train = std::make_shared<data::Subset>(text, 0, split - o.block_size);
  d.test = std::make_shared<data::Subset>(text, split, text->size());
  d.classes = text->vocab_size();
  d.channels = 0;
  d.vocabulary = std::make_shared<data::TextVocabulary>(text->vocabulary());
  d.tokens = tokens;
  return d;
}

nn::GPTConfig gpt_config(const TrainOptions& o, int64_t vocab_size) {
  nn::GPTConfig c;
  c.vocab_size = vocab_size;
  c.block_size = o.block_size;
  c.n_layer = o.n_layer;
  c.n_head = o.n_head;
  c.n_embd = o.n_embd;
  c.dropout = o.dropout;
  return c;
}

std::map<std::string, std::string> gpt_texts(const nn::GPTConfig& c,
                                             const data::TextVocabulary& vocabulary) {
  std::map<std::string, std::string> texts = {
      {"gpt.vocab_size", std::to_string(c.vocab_size)},
      {"gpt.block_size", std::to_string(c.block_size)},
      {"gpt.n_layer", std::to_string(c.n_layer)},
      {"gpt.n_head", std::to_string(c.n_head)},
      {"gpt.n_embd", std::to_string(c.n_embd)},
      {"gpt.tokens", vocabulary.kind() == data::TextVocabulary::Kind::kChar ? "char" : "byte"}};
  if (vocabulary.kind() == data::TextVocabulary::Kind::kChar) {
    std::vector<int64_t> ids(static_cast<size_t>(vocabulary.size()));
    std::iota(ids.begin(), ids.end(), 0);
    texts["gpt.vocabulary"] = vocabulary.decode(ids);  // sorted distinct characters
  }
  return texts;
}

SnapshotGPT load_gpt_snapshot(const std::string& path, Device device) {
  // One read, validated by read_checkpoint; the shape the header claims is checked against the
  // file's own tensors before a model of that shape is allocated.
  const dist::CheckpointFile file = dist::read_checkpoint(path, kCPU);
  std::map<std::string, std::string> texts;
  for (const auto& [key, value] : file.metadata)
    if (key.rfind("texts.", 0) == 0) texts[key.substr(6)] = value;
  nn::GPTConfig c;
  c.vocab_size = text_int(texts, "gpt.vocab_size", path);
  c.block_size = text_int(texts, "gpt.block_size", path);
  c.n_layer = text_int(texts, "gpt.n_layer", path);
  c.n_head = text_int(texts, "gpt.n_head", path);
  c.n_embd = text_int(texts, "gpt.n_embd", path);
  auto shape_of = [&](const std::string& name) {
    const auto it = file.tensors.find("model." + name);
    return it == file.tensors.end() ? Shape{} : it->second.sizes();
  };
  const std::string last_block = "h." + std::to_string(c.n_layer - 1) + ".ln_1.weight";
  EMBER_CHECK(shape_of("wte.weight") == (Shape{c.vocab_size, c.n_embd}) &&
                  shape_of("wpe.weight") == (Shape{c.block_size, c.n_embd}) &&
                  shape_of(last_block) == (Shape{c.n_embd}) &&
                  shape_of("h." + std::to_string(c.n_layer) + ".ln_1.weight").empty(),
              "ember-train sample", path,
              ": its tensors do not hold the GPT its header describes (", c.n_layer, " layers, ",
              c.n_embd, " wide, vocabulary ", c.vocab_size, ", block ", c.block_size, ")");
  SnapshotGPT out;
  const std::string kind = texts.count("gpt.tokens") ? texts.at("gpt.tokens") : "";
  if (kind == "char" && texts.count("gpt.vocabulary")) {
    out.vocabulary = data::TextVocabulary::chars_of(texts.at("gpt.vocabulary"));
  } else {
    EMBER_CHECK(kind == "byte", "ember-train sample", path,
                ": gpt.tokens is neither char (with gpt.vocabulary) nor byte");
  }
  EMBER_CHECK(out.vocabulary.size() == c.vocab_size, "ember-train sample", path,
              ": the vocabulary holds ", out.vocabulary.size(), " tokens but gpt.vocab_size is ",
              c.vocab_size);
  out.model = std::make_shared<nn::GPT>(c);
  nn::NamedTensors state;
  for (const auto& [key, t] : file.tensors)
    if (key.rfind("model.", 0) == 0) state.emplace_back(key.substr(6), t);
  try {
    out.model->load_state_dict(state, /*strict=*/true);
  } catch (const Error& e) {
    EMBER_CHECK(false, "ember-train sample", path, ": ", e.what());
  }
  out.model->to(device);
  out.model->eval();
  return out;
}

int run_sample(const SampleOptions& o) {
  const bool cuda = o.device == "cuda" || (o.device == "auto" && cuda::is_available());
  EMBER_CHECK(!cuda || cuda::is_available(), "ember-train sample",
              "--device cuda but no CUDA device is visible");
  const Device device = cuda ? cuda_device(0) : kCPU;
  SnapshotGPT gpt = load_gpt_snapshot(o.checkpoint, device);
  std::vector<int64_t> prompt = gpt.vocabulary.encode(o.prompt.empty() ? "\n" : o.prompt);
  const auto length = static_cast<int64_t>(prompt.size());
  Generator gen(o.seed);
  for (int64_t s = 0; s < o.samples; ++s) {
    const Tensor idx = from_vector<int64_t>(prompt, {1, length}).to(device);
    const Tensor out = gpt.model->generate(idx, o.tokens, o.temperature, o.top_k, &gen);
    const std::string text = gpt.vocabulary.decode(out.to(kCPU).select(0, 0));
    std::printf("%s\n", text.c_str());
    if (s + 1 < o.samples) std::printf("---\n");
  }
  return 0;
}

}  // namespace ember::apps
