#include "init.h"

#include <cmath>

#include <ember/tensor/grad_mode.h>

namespace ember::nn::init {

std::pair<int64_t, int64_t> fans(const Tensor& weight) {
  EMBER_CHECK(weight.dim() >= 2, "init",
              "fan in and fan out need a tensor with at least 2 dims, got shape ",
              shape_str(weight.sizes()));
  int64_t receptive = 1;
  for (int64_t d = 2; d < weight.dim(); ++d) receptive *= weight.size(d);
  return {weight.size(1) * receptive, weight.size(0) * receptive};
}

double calculate_gain(std::string_view nonlinearity, double a) {
  if (nonlinearity == "linear" || nonlinearity == "conv2d" || nonlinearity == "sigmoid") return 1.0;
  if (nonlinearity == "tanh") return 5.0 / 3.0;
  if (nonlinearity == "relu") return std::sqrt(2.0);
  if (nonlinearity == "leaky_relu") return std::sqrt(2.0 / (1.0 + a * a));
  throw Error(detail::str_cat("calculate_gain: unsupported nonlinearity \"", nonlinearity, "\""));
}

Tensor& uniform_(Tensor& t, double low, double high, Generator* gen) {
  NoGradGuard no_grad;
  return ember::uniform_(t, low, high, gen);
}

Tensor& normal_(Tensor& t, double mean, double stddev, Generator* gen) {
  NoGradGuard no_grad;
  return ember::normal_(t, mean, stddev, gen);
}

Tensor& constant_(Tensor& t, double value) {
  NoGradGuard no_grad;
  return t.fill_(value);
}
Tensor& zeros_(Tensor& t) { return constant_(t, 0.0); }
Tensor& ones_(Tensor& t) { return constant_(t, 1.0); }

namespace {
double kaiming_std(const Tensor& t, double a, FanMode mode, std::string_view nonlinearity) {
  const auto [fan_in, fan_out] = fans(t);
  const int64_t fan = mode == FanMode::kFanIn ? fan_in : fan_out;
  EMBER_CHECK(fan > 0, "kaiming init", "cannot initialise a tensor with zero elements (shape ",
              shape_str(t.sizes()), ")");
  return calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan));
}
}  // namespace

Tensor& kaiming_uniform_(Tensor& t, double a, FanMode mode, std::string_view nonlinearity,
                         Generator* gen) {
  const double bound = std::sqrt(3.0) * kaiming_std(t, a, mode, nonlinearity);
  return init::uniform_(t, -bound, bound, gen);
}

Tensor& kaiming_normal_(Tensor& t, double a, FanMode mode, std::string_view nonlinearity,
                        Generator* gen) {
  return init::normal_(t, 0.0, kaiming_std(t, a, mode, nonlinearity), gen);
}

Tensor& xavier_uniform_(Tensor& t, double gain, Generator* gen) {
  const auto [fan_in, fan_out] = fans(t);
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return init::uniform_(t, -bound, bound, gen);
}

}  // namespace ember::nn::init
