// SyncBatchNorm: batch normalisation whose training statistics cover the whole global
// batch, across all ranks (torch.nn.SyncBatchNorm's model).
//
// Forward (training) makes one collective: every rank all-gathers each rank's count, mean
// and sum of squared deviations per channel, and combines them exactly (Chan's parallel
// variance), so ranks with unequal batch sizes (even zero) are handled. Backward makes one
// all-reduce of sum(dy) and sum(dy * xhat) per channel. The gradients of weight and bias
// are the local ones; DDP's averaging then makes them global (when the input needs no
// gradient, backward communicates nothing). Eval mode normalises with the running
// statistics (this rank's batch when there are none) and communicates nothing; the running
// variance is updated with the unbiased global variance. Parameter and buffer names match
// BatchNorm's, so state dicts load either way. Inside a dist::Join (join.h) ranks that ran
// out of inputs take part with an empty batch, so the statistics cover the active ranks'.
#pragma once

#include <memory>
#include <string>

#include <ember/nn/layers.h>

#include "process_group.h"

namespace ember::dist {

class Join;
namespace detail {
class JoinChannel;
}

class SyncBatchNorm : public nn::BatchNorm {
 public:
  // Accepts inputs [N, C, ...] of 2 to 5 dims.
  SyncBatchNorm(int64_t num_features, std::shared_ptr<ProcessGroup> group, double eps = 1e-5,
                double momentum = 0.1, bool affine = true, bool track_running_stats = true);
  // Over the default group as it is at each training forward, as PyTorch's
  // process_group=None: it may be made before init_process_group(), and a training forward
  // with no default group uses this rank's batch alone, as PyTorch's does.
  explicit SyncBatchNorm(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                         bool affine = true, bool track_running_stats = true);
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "SyncBatchNorm"; }
  // The group the statistics cover (the default group when made without one; ember::Error
  // when there is none).
  std::shared_ptr<ProcessGroup> group() const;

 private:
  friend class Join;
  std::shared_ptr<ProcessGroup> group_;        // null: the default group
  std::shared_ptr<detail::JoinChannel> join_;  // the live Join covering this layer, if any
};

// Replaces every nn::BatchNorm below (and including) `module` with a SyncBatchNorm over
// `group`, copying parameters, buffers and the training flag; returns the module to use
// (the replacement when `module` itself is a BatchNorm, else `module`).
std::shared_ptr<nn::Module> convert_sync_batchnorm(std::shared_ptr<nn::Module> module,
                                                   std::shared_ptr<ProcessGroup> group);
// The same with SyncBatchNorms over the default group (see SyncBatchNorm(num_features)), as
// PyTorch's convert_sync_batchnorm(model).
std::shared_ptr<nn::Module> convert_sync_batchnorm(std::shared_ptr<nn::Module> module);

}  // namespace ember::dist
