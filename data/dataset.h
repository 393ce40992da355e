// Datasets: random access to examples by index.
//
// A Dataset hands out one Example (an input tensor and its target) per index. get()
// is const and must be safe to call from several threads at once: the DataLoader's workers
// share one dataset. Images come out as u8 [H, W, C] (the decoded layout, as PIL's); the
// transforms in transforms.h turn them into f32 [C, H, W] for a model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ember/tensor/tensor.h>

namespace ember::data {

// NOTE: every member has a default initializer, so `{data, label}` and designated
// initializers compile without -Wmissing-field-initializers warnings in user code.
struct Example {
  Tensor data{};
  int64_t target = 0;  // a class index; batches collate these into an i64 [B] tensor
  // Any other target (regression values, a multi-label vector, a mask): when defined, it is
  // the example's target instead of `target`, and batches stack it into [B, ...] of its dtype.
  Tensor target_tensor{};
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // The example at `index` in [0, size()); ember::Error for an index out of range.
  virtual Example get(int64_t index) const = 0;
  // Where example `index` comes from (a file path), for error messages; "" when there is
  // nothing more to say than the index.
  virtual std::string describe(int64_t /*index*/) const { return {}; }

 protected:
  // Throws ember::Error naming `op` when index is outside [0, size()).
  void check_index(int64_t index, const char* op) const;
};

// Examples held in memory: row i of `data` (a view, no copy) with row i of `targets`
// (torch.utils.data.TensorDataset's model).
class TensorDataset : public Dataset {
 public:
  // data: [N, ...] on the CPU. targets: [N] of an integer dtype (class indices), or any
  // other [N, ...] CPU tensor (float regression targets, multi-label rows), which examples
  // carry as target_tensor.
  TensorDataset(Tensor data, Tensor targets);
  int64_t size() const override { return data_.size(0); }
  Example get(int64_t index) const override;
  const Tensor& data() const { return data_; }
  // The class indices (empty when the targets are tensors).
  const std::vector<int64_t>& targets() const { return class_targets_; }
  // The targets as given.
  const Tensor& target_tensor() const { return targets_; }

 private:
  Tensor data_;
  Tensor targets_;
  bool has_class_targets_ = false;
  std::vector<int64_t> class_targets_;
};

// A contiguous slice of another dataset, examples [begin, end) renumbered from 0, e.g. a
// validation split (torch.utils.data.Subset over range(begin, end)). Shares the dataset.
class Subset : public Dataset {
 public:
  // ember::Error unless 0 <= begin <= end <= dataset->size().
  Subset(std::shared_ptr<const Dataset> dataset, int64_t begin, int64_t end);
  int64_t size() const override { return end_ - begin_; }
  Example get(int64_t index) const override;
  std::string describe(int64_t index) const override;

 private:
  std::shared_ptr<const Dataset> dataset_;
  int64_t begin_, end_;
};

}  // namespace ember::data
