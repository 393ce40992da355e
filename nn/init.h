// Parameter initialisers with PyTorch's definitions (torch.nn.init). They fill in place
// without recording gradients and draw from ember's generators.
#pragma once

#include <string_view>
#include <utility>

#include <ember/tensor/random.h>

namespace ember::nn::init {

// (fan_in, fan_out) of a weight: [out, in] or [out, in, k...] (fan multiplied by the kernel size).
std::pair<int64_t, int64_t> fans(const Tensor& weight);
// The recommended gain for a nonlinearity: "linear"/"conv2d"/"sigmoid" 1, "tanh" 5/3,
// "relu" sqrt(2), "leaky_relu" sqrt(2 / (1 + a^2)).
double calculate_gain(std::string_view nonlinearity, double a = 0.0);

enum class FanMode { kFanIn, kFanOut };

Tensor& uniform_(Tensor& t, double low, double high, Generator* gen = nullptr);
Tensor& normal_(Tensor& t, double mean, double stddev, Generator* gen = nullptr);
Tensor& constant_(Tensor& t, double value);
Tensor& zeros_(Tensor& t);
Tensor& ones_(Tensor& t);
Tensor& kaiming_uniform_(Tensor& t, double a = 0.0, FanMode mode = FanMode::kFanIn,
                         std::string_view nonlinearity = "leaky_relu", Generator* gen = nullptr);
Tensor& kaiming_normal_(Tensor& t, double a = 0.0, FanMode mode = FanMode::kFanIn,
                        std::string_view nonlinearity = "leaky_relu", Generator* gen = nullptr);
Tensor& xavier_uniform_(Tensor& t, double gain = 1.0, Generator* gen = nullptr);

}  // namespace ember::nn::init
