#include "dataset.h"

#include <utility>

#include <ember/tensor/error.h>

namespace ember::data {

void Dataset::check_index(int64_t index, const char* op) const {
  EMBER_CHECK(index >= 0 && index < size(), op, "index ", index, " is out of range for ", size(),
              " examples");
}

TensorDataset::TensorDataset(Tensor data, Tensor targets) {
  EMBER_CHECK(data.defined() && targets.defined(), "TensorDataset",
              "data and targets must be defined tensors");
  EMBER_CHECK(data.dim() >= 1, "TensorDataset", "data must have a leading example dim, got a ",
              data.dim(), "-d tensor");
  EMBER_CHECK(data.is_cpu(), "TensorDataset", "data must be on the CPU, got ", data.device());
  EMBER_CHECK(targets.dim() >= 1, "TensorDataset",
              "targets must have a leading example dim, got a 0-d tensor");
  EMBER_CHECK(targets.is_cpu(), "TensorDataset", "targets must be on the CPU, got ",
              targets.device());
  EMBER_CHECK(targets.size(0) == data.size(0), "TensorDataset", "data has ", data.size(0),
              " examples but targets has ", targets.size(0), " (data ", shape_str(data.sizes()),
              ")");
  data_ = std::move(data);
  has_class_targets_ = targets.dim() == 1 && is_integral(targets.dtype(), false);
  if (has_class_targets_) class_targets_ = targets.to_vector<int64_t>();
  targets_ = std::move(targets);
}

Example TensorDataset::get(int64_t index) const {
  check_index(index, "TensorDataset::get");
  if (!has_class_targets_) return {data_.select(0, index), 0, targets_.select(0, index)};
  return {data_.select(0, index), class_targets_[static_cast<size_t>(index)], {}};
}

Subset::Subset(std::shared_ptr<const Dataset> dataset, int64_t begin, int64_t end)
    : dataset_(std::move(dataset)), begin_(begin), end_(end) {
  EMBER_CHECK(dataset_ != nullptr, "Subset", "the dataset is null");
  EMBER_CHECK(0 <= begin && begin <= end && end <= dataset_->size(), "Subset", "range [", begin,
              ", ", end, ") is not within the dataset's ", dataset_->size(), " examples");
}

Example Subset::get(int64_t index) const {
  check_index(index, "Subset::get");
  return dataset_->get(begin_ + index);
}

std::string Subset::describe(int64_t index) const { return dataset_->describe(begin_ + index); }

}  // namespace ember::data
