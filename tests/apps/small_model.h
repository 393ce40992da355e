// What the apps tests train: a model without batch norm (a batch's gradient is the mean of
// its samples'), its SGD, and its parameters flattened for comparing two runs.
#pragma once

#include <memory>
#include <vector>

#include <ember/ember.h>

namespace ember::apps::testing {

inline std::shared_ptr<nn::Module> small_model() {
  manual_seed(7);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 3)});
}

inline std::unique_ptr<optim::SGD> make_sgd(nn::Module& model) {
  return std::make_unique<optim::SGD>(
      model.parameters(),
      optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
}

// `size` samples for small_model(): features from randn, labels in [0, 3), seeded.
inline data::Batch random_batch(int64_t size, uint64_t seed) {
  manual_seed(seed);
  data::Batch b;
  b.data = randn({size, 8});
  b.target = randint(0, 3, {size});
  return b;
}

inline std::vector<float> flat_parameters(const nn::Module& model) {
  std::vector<float> out;
  for (const Tensor& p : model.parameters()) {
    const auto v = p.contiguous().to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace ember::apps::testing
