// ResNets: the CIFAR family (ResNet-20/32/56/110: three stages of 16/32/64 channels, He et
// al. 2015) and ResNet-18/34 (basic blocks, 64..512 channels) with a CIFAR 3x3 stem or the
// ImageNet 7x7 stem and max pool. Parameter names follow torchvision (conv1, bn1,
// layer1.0.conv1, ..., layerK.0.downsample.0, fc), so weights map one to one.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "layers.h"

namespace ember::nn {

// Two 3x3 convolutions with batch norm, plus the input (through a 1x1 convolution and
// batch norm when the shape changes).
class BasicBlock : public Module {
 public:
  BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride);
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "BasicBlock"; }
  // See ResNet::set_fused.
  void set_fused(bool fused) { fused_ = fused; }
  bool fused() const { return fused_; }

 private:
  bool has_downsample_ = false;
  bool fused_ = true;
};

enum class Stem { kCifar, kImageNet };

class ResNet : public Module {
 public:
  // stage_channels[i] channels and blocks_per_stage[i] blocks in stage i (stride 2 from the
  // second stage on).
  ResNet(const std::vector<int64_t>& stage_channels, const std::vector<int64_t>& blocks_per_stage,
         int64_t num_classes, int64_t in_channels, Stem stem);
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "ResNet"; }
  // On by default: the stem's bn1 + ReLU and each block's bn1 + ReLU and bn2 + shortcut +
  // ReLU run as fused ops (batch_norm_relu, batch_norm_add_relu). Off: batch_norm, add and
  // relu one by one, as eager PyTorch (the reference for parity tests); results agree within
  // rounding. A BN child that is not a plain BatchNorm2d (SyncBatchNorm after
  // dist::convert_sync_batchnorm, or a user's module) is always called itself, then add/relu.
  void set_fused(bool fused);
  bool fused() const { return fused_; }

 private:
  bool fused_ = true;
};

std::shared_ptr<ResNet> resnet20(int64_t num_classes = 10, int64_t in_channels = 3);
std::shared_ptr<ResNet> resnet32(int64_t num_classes = 10, int64_t in_channels = 3);
std::shared_ptr<ResNet> resnet56(int64_t num_classes = 10, int64_t in_channels = 3);
std::shared_ptr<ResNet> resnet110(int64_t num_classes = 10, int64_t in_channels = 3);
std::shared_ptr<ResNet> resnet18(int64_t num_classes = 10, int64_t in_channels = 3,
                                 Stem stem = Stem::kCifar);
std::shared_ptr<ResNet> resnet34(int64_t num_classes = 10, int64_t in_channels = 3,
                                 Stem stem = Stem::kCifar);
// By name: "resnet20", "resnet32", "resnet56", "resnet110", "resnet18", "resnet34" (CIFAR
// stem), "resnet18-imagenet", "resnet34-imagenet"; ember::Error listing them otherwise.
std::shared_ptr<ResNet> resnet(std::string_view name, int64_t num_classes = 10,
                               int64_t in_channels = 3);

}  // namespace ember::nn
