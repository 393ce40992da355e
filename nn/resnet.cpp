#include "resnet.h"

#include <cmath>
#include <typeinfo>

#include "init.h"

namespace ember::nn {

namespace {

std::shared_ptr<Conv2d> conv3x3(int64_t in, int64_t out, int64_t stride) {
  return std::make_shared<Conv2d>(in, out, 3,
                                  Conv2dOptions{{stride, stride}, {1, 1}, {1, 1}, 1, false});
}

// `module` as a BatchNorm when it is exactly a BatchNorm2d (so its fused ReLU form computes
// what its forward would), else null: a replaced module (SyncBatchNorm, a user's) keeps its
// own forward.
BatchNorm* plain_batch_norm(const std::shared_ptr<Module>& module) {
  Module& m = *module;
  return typeid(m) == typeid(BatchNorm2d) ? static_cast<BatchNorm*>(module.get()) : nullptr;
}

// relu(bn(x) + residual) (residual undefined: relu(bn(x))), fused when `fused` allows and bn
// is a plain BatchNorm2d.
Tensor bn_relu(const std::shared_ptr<Module>& bn, const Tensor& x, const Tensor& residual,
               bool fused) {
  if (BatchNorm* plain = fused ? plain_batch_norm(bn) : nullptr) {
    const ModuleCall call(*plain);  // the BatchNorm's forward, fused with the ReLU
    return plain->forward_relu(x, residual);
  }
  const Tensor y = (*bn)(x);
  return relu(residual.defined() ? y + residual : y);
}

}  // namespace

BasicBlock::BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride) {
  register_module("conv1", conv3x3(in_channels, out_channels, stride));
  register_module("bn1", std::make_shared<BatchNorm2d>(out_channels));
  register_module("conv2", conv3x3(out_channels, out_channels, 1));
  register_module("bn2", std::make_shared<BatchNorm2d>(out_channels));
  if (stride != 1 || in_channels != out_channels) {
    has_downsample_ = true;
    register_module(
        "downsample",
        std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
            std::make_shared<Conv2d>(in_channels, out_channels, 1,
                                     Conv2dOptions{{stride, stride}, {0, 0}, {1, 1}, 1, false}),
            std::make_shared<BatchNorm2d>(out_channels)}));
  }
}

Tensor BasicBlock::forward(const Tensor& input) {
  // Submodules are looked up by name, so convert_sync_batchnorm's replacements take effect.
  const auto& children = named_children();
  auto child = [&children](size_t i) { return children[i].second; };
  const Tensor out = (*child(2))(bn_relu(child(1), (*child(0))(input), {}, fused_));
  const Tensor shortcut = has_downsample_ ? (*child(4))(input) : input;
  return bn_relu(child(3), out, shortcut, fused_);
}

ResNet::ResNet(const std::vector<int64_t>& stage_channels,
               const std::vector<int64_t>& blocks_per_stage, int64_t num_classes,
               int64_t in_channels, Stem stem) {
  EMBER_CHECK(!stage_channels.empty() && stage_channels.size() == blocks_per_stage.size(), "ResNet",
              "need one block count per stage, got ", stage_channels.size(), " stages and ",
              blocks_per_stage.size(), " counts");
  EMBER_CHECK(num_classes > 0 && in_channels > 0, "ResNet", "num_classes (", num_classes,
              ") and in_channels (", in_channels, ") must be positive");
  const int64_t width = stage_channels[0];
  if (stem == Stem::kImageNet) {
    register_module("conv1",
                    std::make_shared<Conv2d>(in_channels, width, 7,
                                             Conv2dOptions{{2, 2}, {3, 3}, {1, 1}, 1, false}));
  } else {
    register_module("conv1", conv3x3(in_channels, width, 1));
  }
  register_module("bn1", std::make_shared<BatchNorm2d>(width));
  if (stem == Stem::kImageNet)
    register_module("maxpool", std::make_shared<MaxPool2d>(Pair{3, 3}, Pair{2, 2}, Pair{1, 1}));
  int64_t channels = width;
  for (size_t s = 0; s < stage_channels.size(); ++s) {
    auto stage = std::make_shared<Sequential>();
    for (int64_t b = 0; b < blocks_per_stage[s]; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      stage->push_back(std::make_shared<BasicBlock>(channels, stage_channels[s], stride));
      channels = stage_channels[s];
    }
    register_module("layer" + std::to_string(s + 1), stage);
  }
  register_module("fc", std::make_shared<Linear>(channels, num_classes));
  // torchvision's initialisation: kaiming-normal (fan_out, relu) convolutions, BN 1 and 0.
  for (auto& [name, module] : named_modules()) {
    if (auto* conv = dynamic_cast<Conv2d*>(module)) {
      init::kaiming_normal_(conv->weight, 0.0, init::FanMode::kFanOut, "relu");
    }
  }
}

Tensor ResNet::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& [name, module] : named_children()) {
    if (name == "fc") {
      x = adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    } else if (name == "bn1") {
      x = bn_relu(module, x, {}, fused_);
      continue;
    }
    x = (*module)(x);
  }
  return x;
}

void ResNet::set_fused(bool fused) {
  fused_ = fused;
  for (auto& [name, module] : named_modules()) {
    if (auto* block = dynamic_cast<BasicBlock*>(module)) block->set_fused(fused);
  }
}

std::shared_ptr<ResNet> resnet20(int64_t c, int64_t in) {
  return std::make_shared<ResNet>(std::vector<int64_t>{16, 32, 64}, std::vector<int64_t>{3, 3, 3},
                                  c, in, Stem::kCifar);
}
std::shared_ptr<ResNet> resnet32(int64_t c, int64_t in) {
  return std::make_shared<ResNet>(std::vector<int64_t>{16, 32, 64}, std::vector<int64_t>{5, 5, 5},
                                  c, in, Stem::kCifar);
}
std::shared_ptr<ResNet> resnet56(int64_t c, int64_t in) {
  return std::make_shared<ResNet>(std::vector<int64_t>{16, 32, 64}, std::vector<int64_t>{9, 9, 9},
                                  c, in, Stem::kCifar);
}
std::shared_ptr<ResNet> resnet110(int64_t c, int64_t in) {
  return std::make_shared<ResNet>(std::vector<int64_t>{16, 32, 64},
                                  std::vector<int64_t>{18, 18, 18}, c, in, Stem::kCifar);
}
std::shared_ptr<ResNet> resnet18(int64_t c, int64_t in, Stem stem) {
  return std::make_shared<ResNet>(std::vector<int64_t>{64, 128, 256, 512},
                                  std::vector<int64_t>{2, 2, 2, 2}, c, in, stem);
}
std::shared_ptr<ResNet> resnet34(int64_t c, int64_t in, Stem stem) {
  return std::make_shared<ResNet>(std::vector<int64_t>{64, 128, 256, 512},
                                  std::vector<int64_t>{3, 4, 6, 3}, c, in, stem);
}

std::shared_ptr<ResNet> resnet(std::string_view name, int64_t num_classes, int64_t in_channels) {
  if (name == "resnet20") return resnet20(num_classes, in_channels);
  if (name == "resnet32") return resnet32(num_classes, in_channels);
  if (name == "resnet56") return resnet56(num_classes, in_channels);
  if (name == "resnet110") return resnet110(num_classes, in_channels);
  if (name == "resnet18") return resnet18(num_classes, in_channels);
  if (name == "resnet34") return resnet34(num_classes, in_channels);
  if (name == "resnet18-imagenet") return resnet18(num_classes, in_channels, Stem::kImageNet);
  if (name == "resnet34-imagenet") return resnet34(num_classes, in_channels, Stem::kImageNet);
  throw Error(detail::str_cat(
      "resnet: unknown model \"", name, "\" (expected resnet20, resnet32, resnet56, ",
      "resnet110, resnet18, resnet34, resnet18-imagenet or resnet34-imagenet)"));
}

}  // namespace ember::nn
