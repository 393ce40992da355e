// What both tutorial programs share, as the tutorial's own files do: the toy data set
// (MyTrainDataset: 2048 random (20 features, 1 target) pairs), the model (Linear(20, 1)), the
// optimizer (SGD, lr 1e-3) and the loader (batch 32, DistributedSampler, shuffle off in the
// loader itself). Parameters and data are f64 here so the test can compare runs to 1e-8.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <ember/ember.h>

namespace tutorial {

using namespace ember;

inline std::shared_ptr<data::TensorDataset> my_train_dataset(int64_t size) {
  Generator gen(2024);  // the same data on every rank (the test compares world sizes)
  return std::make_shared<data::TensorDataset>(rand({size, 20}, kF64, &gen),
                                               rand({size, 1}, kF64, &gen));
}

inline std::shared_ptr<nn::Linear> make_model() {
  manual_seed(0);  // DDP broadcasts rank 0's parameters anyway
  auto model = std::make_shared<nn::Linear>(20, 1);
  model->to(kF64);
  return model;
}

// DataLoader(dataset, batch_size, pin_memory=True, shuffle=False,
//            sampler=DistributedSampler(dataset))
inline std::unique_ptr<data::DataLoader> prepare_dataloader(
    const std::shared_ptr<data::TensorDataset>& dataset, int64_t batch_size) {
  data::DataLoaderOptions options;
  options.batch_size = batch_size;
  options.pin_memory = true;
  options.shuffle = false;
  options.sampler = std::make_shared<dist::DistributedSampler>(*dataset);
  return std::make_unique<data::DataLoader>(dataset, options);
}

// The parameters, flattened, for comparing ranks and runs.
inline std::vector<double> flat_parameters(nn::Module& model) {
  std::vector<double> out;
  for (const Tensor& p : model.parameters()) {
    const auto values = p.detach().contiguous().to_vector<double>();
    out.insert(out.end(), values.begin(), values.end());
  }
  return out;
}

inline int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::atoi(value) : fallback;
}

}  // namespace tutorial
