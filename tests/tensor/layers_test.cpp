// The layer ops (conv2d, batch_norm, pooling, cross_entropy) against plain reference loops:
// forward through the public ops, backward through the computations autograd's formulas call
// (detail/layer_backward.h), and finite-difference gradient checks of the ops in f64.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include <ember/tensor/detail/layer_backward.h>

#include "test_util.h"

namespace ember {
namespace {

using ember::testing::expect_close;
using Values = std::vector<double>;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

int64_t numel_of(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

Tensor tensor_of(const Values& values, const Shape& shape, DType dtype = kF64) {
  return from_vector(values, {static_cast<int64_t>(values.size())}).reshape(shape).to(dtype);
}

Values random_values(int64_t n, unsigned seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Values v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

double tol_for(DType dtype) { return dtype == kF64 ? 1e-10 : dtype == kF32 ? 2e-5 : 2e-2; }

// ---------------------------------------------------------------------------------------
// conv2d

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw;
  Pair stride, padding, dilation;
  int64_t groups;
  bool bias;
};

int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

struct ConvRef {
  Shape out_shape;
  Values out;
  Values gx, gw, gb;  // filled by the backward reference
};

// Direct convolution and its gradients for grad_out `gy`, by loops in double.
ConvRef ref_conv(const ConvCase& k, const Values& x, const Values& w, const Values& b,
                 const Values* gy) {
  const int64_t ho = out_size(k.h, k.kh, k.stride[0], k.padding[0], k.dilation[0]);
  const int64_t wo = out_size(k.w, k.kw, k.stride[1], k.padding[1], k.dilation[1]);
  const int64_t cg = k.c / k.groups, og = k.o / k.groups;
  ConvRef r;
  r.out_shape = {k.n, k.o, ho, wo};
  r.out.assign(static_cast<size_t>(numel_of(r.out_shape)), 0.0);
  if (gy) {
    r.gx.assign(x.size(), 0.0);
    r.gw.assign(w.size(), 0.0);
    r.gb.assign(static_cast<size_t>(k.o), 0.0);
  }
  for (int64_t n = 0; n < k.n; ++n) {
    for (int64_t o = 0; o < k.o; ++o) {
      const int64_t g = o / og;
      for (int64_t i = 0; i < ho; ++i) {
        for (int64_t j = 0; j < wo; ++j) {
          const auto oi = static_cast<size_t>(((n * k.o + o) * ho + i) * wo + j);
          double acc = k.bias ? b[static_cast<size_t>(o)] : 0.0;
          const double go = gy ? (*gy)[oi] : 0.0;
          if (gy) r.gb[static_cast<size_t>(o)] += go;
          for (int64_t ci = 0; ci < cg; ++ci) {
            const int64_t c = g * cg + ci;
            for (int64_t u = 0; u < k.kh; ++u) {
              const int64_t ih = i * k.stride[0] - k.padding[0] + u * k.dilation[0];
              if (ih < 0 || ih >= k.h) continue;
              for (int64_t v = 0; v < k.kw; ++v) {
                const int64_t iw = j * k.stride[1] - k.padding[1] + v * k.dilation[1];
                if (iw < 0 || iw >= k.w) continue;
                const auto xi = static_cast<size_t>(((n * k.c + c) * k.h + ih) * k.w + iw);
                const auto wi = static_cast<size_t>(((o * cg + ci) * k.kh + u) * k.kw + v);
                acc += x[xi] * w[wi];
                if (gy) {
                  r.gx[xi] += go * w[wi];
                  r.gw[wi] += go * x[xi];
                }
              }
            }
          }
          r.out[oi] = acc;
        }
      }
    }
  }
  return r;
}

std::vector<ConvCase> conv_cases() {
  return {
      {2, 3, 7, 6, 4, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
      {2, 3, 8, 9, 5, 3, 2, {2, 1}, {0, 1}, {1, 1}, 1, false},
      {1, 4, 9, 7, 6, 3, 3, {1, 2}, {2, 1}, {2, 1}, 2, true},
      {3, 6, 5, 5, 6, 3, 3, {1, 1}, {1, 1}, {1, 1}, 6, true},  // depthwise
      {2, 4, 6, 5, 8, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, true},  // pointwise
      {2, 4, 6, 5, 6, 1, 1, {1, 1}, {0, 0}, {1, 1}, 2, false},
      {2, 4, 7, 7, 3, 1, 1, {2, 2}, {0, 0}, {1, 1}, 1, false},  // strided downsample
      {1, 2, 4, 4, 3, 5, 5, {1, 1}, {2, 2}, {1, 1}, 1, true},   // kernel wider than unpadded
      {2, 2, 10, 3, 2, 2, 3, {3, 2}, {1, 0}, {2, 1}, 1, true},
  };
}

detail::Conv2dParams conv_params(const ConvCase& k) {
  detail::Conv2dParams p;
  for (size_t i = 0; i < 2; ++i) {
    p.stride[i] = k.stride[i];
    p.padding[i] = k.padding[i];
    p.dilation[i] = k.dilation[i];
  }
  p.groups = k.groups;
  return p;
}

struct ConvInputs {
  Values x, w, b;
  Shape x_shape, w_shape;
};

ConvInputs conv_inputs(const ConvCase& k, unsigned seed) {
  ConvInputs in;
  in.x_shape = {k.n, k.c, k.h, k.w};
  in.w_shape = {k.o, k.c / k.groups, k.kh, k.kw};
  in.x = random_values(numel_of(in.x_shape), seed);
  in.w = random_values(numel_of(in.w_shape), seed + 1);
  in.b = random_values(k.o, seed + 2);
  return in;
}

TEST(LayersConv, ForwardMatchesReference) {
  unsigned seed = 10;
  for (const ConvCase& k : conv_cases()) {
    const ConvInputs in = conv_inputs(k, seed += 3);
    const ConvRef ref = ref_conv(k, in.x, in.w, in.b, nullptr);
    for (DType dtype : {kF64, kF32}) {
      SCOPED_TRACE(::testing::Message() << dtype << " x " << shape_str(in.x_shape) << " w "
                                        << shape_str(in.w_shape) << " groups " << k.groups);
      const Tensor b = k.bias ? tensor_of(in.b, {k.o}, dtype) : Tensor();
      const Tensor y =
          conv2d(tensor_of(in.x, in.x_shape, dtype), tensor_of(in.w, in.w_shape, dtype), b,
                 k.stride, k.padding, k.dilation, k.groups);
      expect_close(y, tensor_of(ref.out, ref.out_shape, dtype), tol_for(dtype), tol_for(dtype));
    }
  }
}

TEST(LayersConv, BackwardMatchesReference) {
  unsigned seed = 50;
  for (const ConvCase& k : conv_cases()) {
    const ConvInputs in = conv_inputs(k, seed += 4);
    const ConvRef shape_only = ref_conv(k, in.x, in.w, in.b, nullptr);
    const Values gy = random_values(numel_of(shape_only.out_shape), seed + 3);
    const ConvRef ref = ref_conv(k, in.x, in.w, in.b, &gy);
    for (DType dtype : {kF64, kF32}) {
      SCOPED_TRACE(::testing::Message() << dtype << " x " << shape_str(in.x_shape) << " w "
                                        << shape_str(in.w_shape) << " groups " << k.groups);
      const Tensor x = tensor_of(in.x, in.x_shape, dtype), w = tensor_of(in.w, in.w_shape, dtype);
      const Tensor gyt = tensor_of(gy, ref.out_shape, dtype);
      const double tol = tol_for(dtype) * 10;
      const auto g = detail::conv2d_backward(gyt, x, w, conv_params(k), {true, true, k.bias});
      expect_close(g[0], tensor_of(ref.gx, in.x_shape, dtype), tol, tol);
      expect_close(g[1], tensor_of(ref.gw, in.w_shape, dtype), tol, tol);
      EXPECT_EQ(g[2].defined(), k.bias);
      if (k.bias) expect_close(g[2], tensor_of(ref.gb, {k.o}, dtype), tol, tol);
      // Only the weight's gradient asked for: the others stay undefined.
      const auto only_w = detail::conv2d_backward(gyt, x, w, conv_params(k), {false, true, false});
      EXPECT_FALSE(only_w[0].defined());
      expect_close(only_w[1], g[1], 0, 0);
    }
  }
}

// Enough samples that the kernel splits the batch into several chunks.
TEST(LayersConv, LargeBatchSpansChunks) {
  const ConvCase k{20, 32, 32, 32, 4, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true};
  const ConvInputs in = conv_inputs(k, 7);
  const ConvRef shape_only = ref_conv(k, in.x, in.w, in.b, nullptr);
  const Values gy = random_values(numel_of(shape_only.out_shape), 8);
  const ConvRef ref = ref_conv(k, in.x, in.w, in.b, &gy);
  const Tensor x = tensor_of(in.x, in.x_shape, kF32), w = tensor_of(in.w, in.w_shape, kF32);
  const Tensor y = conv2d(x, w, tensor_of(in.b, {k.o}, kF32), k.stride, k.padding);
  expect_close(y, tensor_of(ref.out, ref.out_shape, kF32), 1e-4, 1e-4);
  const auto g = detail::conv2d_backward(tensor_of(gy, ref.out_shape, kF32), x, w, conv_params(k),
                                         {true, true, true});
  expect_close(g[0], tensor_of(ref.gx, in.x_shape, kF32), 1e-4, 1e-4);
  expect_close(g[1], tensor_of(ref.gw, in.w_shape, kF32), 1e-4, 1e-3);
  expect_close(g[2], tensor_of(ref.gb, {k.o}, kF32), 1e-4, 1e-3);
}

TEST(LayersConv, HalfPrecisionMatchesFloat) {
  const ConvCase k{2, 4, 6, 6, 4, 3, 3, {1, 1}, {1, 1}, {1, 1}, 2, true};
  const ConvInputs in = conv_inputs(k, 21);
  for (DType dtype : {kF16, kBF16}) {
    SCOPED_TRACE(::testing::Message() << dtype);
    const Tensor x = tensor_of(in.x, in.x_shape, dtype), w = tensor_of(in.w, in.w_shape, dtype);
    const Tensor b = tensor_of(in.b, {k.o}, dtype);
    const Tensor y = conv2d(x, w, b, k.stride, k.padding, k.dilation, k.groups);
    ASSERT_EQ(y.dtype(), dtype);
    const Tensor expected =
        conv2d(x.to(kF32), w.to(kF32), b.to(kF32), k.stride, k.padding, k.dilation, k.groups);
    expect_close(y.to(kF32), expected, dtype == kF16 ? 2e-3 : 1e-2, dtype == kF16 ? 2e-3 : 1e-2);
  }
}

// ---------------------------------------------------------------------------------------
// batch_norm

struct BnRef {
  Values out, mean, var_biased, var_unbiased;
};

BnRef ref_bn_train(const Values& x, int64_t n, int64_t c, int64_t s, const Values& w,
                   const Values& b, double eps) {
  BnRef r;
  r.out.resize(x.size());
  const auto at = [&](int64_t i, int64_t ch, int64_t k) {
    return static_cast<size_t>((i * c + ch) * s + k);
  };
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < s; ++k) sum += x[at(i, ch, k)];
    const double count = static_cast<double>(n * s), mean = sum / count;
    double sq = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < s; ++k) sq += (x[at(i, ch, k)] - mean) * (x[at(i, ch, k)] - mean);
    r.mean.push_back(mean);
    r.var_biased.push_back(sq / count);
    r.var_unbiased.push_back(sq / (count - 1));
    const double inv = 1.0 / std::sqrt(sq / count + eps);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < s; ++k)
        r.out[at(i, ch, k)] = (x[at(i, ch, k)] - mean) * inv * w[static_cast<size_t>(ch)] +
                              b[static_cast<size_t>(ch)];
  }
  return r;
}

TEST(LayersBatchNorm, TrainingNormalisesAndUpdatesRunningStats) {
  const int64_t n = 4, c = 3, h = 2, w = 5, s = h * w;
  const Values x = random_values(n * c * s, 3, -2.0, 3.0);
  const Values weight = {0.5, -1.5, 2.0}, bias = {0.1, 0.2, -0.3};
  const Values rm0 = {0.2, -0.1, 0.4}, rv0 = {1.5, 0.7, 1.1};
  const double momentum = 0.25, eps = 1e-3;
  const BnRef ref = ref_bn_train(x, n, c, s, weight, bias, eps);
  for (DType dtype : {kF64, kF32}) {
    SCOPED_TRACE(::testing::Message() << dtype);
    const Tensor rm = tensor_of(rm0, {c}, dtype), rv = tensor_of(rv0, {c}, dtype);
    const Tensor y = batch_norm(tensor_of(x, {n, c, h, w}, dtype), tensor_of(weight, {c}, dtype),
                                tensor_of(bias, {c}, dtype), rm, rv, true, momentum, eps);
    const double tol = tol_for(dtype) * 10;
    expect_close(y, tensor_of(ref.out, {n, c, h, w}, dtype), tol, tol);
    Values rm_ref, rv_ref;
    for (int64_t ch = 0; ch < c; ++ch) {
      const auto i = static_cast<size_t>(ch);
      rm_ref.push_back((1 - momentum) * rm0[i] + momentum * ref.mean[i]);
      rv_ref.push_back((1 - momentum) * rv0[i] + momentum * ref.var_unbiased[i]);
    }
    expect_close(rm, tensor_of(rm_ref, {c}, dtype), tol, tol);
    expect_close(rv, tensor_of(rv_ref, {c}, dtype), tol, tol);
  }
}

TEST(LayersBatchNorm, TrainingWithoutAffineOrRunningStats) {
  const int64_t n = 5, c = 2;
  const Values x = random_values(n * c, 4);
  const BnRef ref = ref_bn_train(x, n, c, 1, {1.0, 1.0}, {0.0, 0.0}, 1e-5);
  const Tensor y = batch_norm(tensor_of(x, {n, c}), {}, {}, {}, {}, true);
  expect_close(y, tensor_of(ref.out, {n, c}), 1e-10, 1e-10);
}

TEST(LayersBatchNorm, EvalUsesRunningStats) {
  const int64_t n = 3, c = 2, s = 4;
  const Values x = random_values(n * c * s, 5);
  const Values weight = {1.5, -0.5}, bias = {0.3, 0.0}, rm = {0.1, -0.2}, rv = {0.9, 2.0};
  const double eps = 1e-5;
  Values expected(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t ch = (i / static_cast<size_t>(s)) % static_cast<size_t>(c);
    expected[i] = (x[i] - rm[ch]) / std::sqrt(rv[ch] + eps) * weight[ch] + bias[ch];
  }
  for (DType dtype : {kF64, kF32}) {
    const Tensor running_mean = tensor_of(rm, {c}, dtype), running_var = tensor_of(rv, {c}, dtype);
    const Tensor y = batch_norm(tensor_of(x, {n, c, s}, dtype), tensor_of(weight, {c}, dtype),
                                tensor_of(bias, {c}, dtype), running_mean, running_var, false);
    expect_close(y, tensor_of(expected, {n, c, s}, dtype), tol_for(dtype), tol_for(dtype));
    expect_close(running_mean, tensor_of(rm, {c}, dtype), 0, 0);  // untouched in eval
    expect_close(running_var, tensor_of(rv, {c}, dtype), 0, 0);
  }
}

// Backward of training-mode batch norm by its closed form, against autograd.
TEST(LayersBatchNorm, BackwardMatchesClosedForm) {
  const int64_t n = 3, c = 2, s = 6;
  const Values x = random_values(n * c * s, 6, -1.0, 2.0), gy = random_values(n * c * s, 7);
  const Values weight = {0.7, -1.3}, bias = {0.2, 0.1};
  const double eps = 1e-5;
  const BnRef ref = ref_bn_train(x, n, c, s, weight, bias, eps);
  Values gx(x.size()), gw(2, 0.0), gb(2, 0.0), gx_eval(x.size()), gw_eval(2, 0.0);
  const Values rm = {0.3, -0.4}, rv = {1.2, 0.6};
  for (int64_t ch = 0; ch < c; ++ch) {
    const auto C = static_cast<size_t>(ch);
    const double inv = 1.0 / std::sqrt(ref.var_biased[C] + eps);
    const double inv_eval = 1.0 / std::sqrt(rv[C] + eps);
    double sg = 0, sgx = 0;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = 0; k < s; ++k) {
        const auto at = static_cast<size_t>((i * c + ch) * s + k);
        sg += gy[at];
        sgx += gy[at] * (x[at] - ref.mean[C]) * inv;
        gw_eval[C] += gy[at] * (x[at] - rm[C]) * inv_eval;
        gx_eval[at] = gy[at] * weight[C] * inv_eval;
      }
    }
    gw[C] = sgx;
    gb[C] = sg;
    const double count = static_cast<double>(n * s);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = 0; k < s; ++k) {
        const auto at = static_cast<size_t>((i * c + ch) * s + k);
        const double xhat = (x[at] - ref.mean[C]) * inv;
        gx[at] = weight[C] * inv * (gy[at] - sg / count - xhat * sgx / count);
      }
    }
  }
  for (DType dtype : {kF64, kF32}) {
    for (bool training : {true, false}) {
      SCOPED_TRACE(::testing::Message() << dtype << (training ? " train" : " eval"));
      // The statistics the forward saves: batch ones in training, running ones in eval.
      Values save_mean, save_invstd;
      for (size_t ch = 0; ch < 2; ++ch) {
        save_mean.push_back(training ? ref.mean[ch] : rm[ch]);
        save_invstd.push_back(1.0 / std::sqrt((training ? ref.var_biased[ch] : rv[ch]) + eps));
      }
      const auto g = detail::batch_norm_backward(
          tensor_of(gy, {n, c, s}, dtype), tensor_of(x, {n, c, s}, dtype),
          tensor_of(weight, {c}, dtype), tensor_of(save_mean, {c}, dtype),
          tensor_of(save_invstd, {c}, dtype), training, {true, true, true});
      const double tol = tol_for(dtype) * 10;
      expect_close(g[0], tensor_of(training ? gx : gx_eval, {n, c, s}, dtype), tol, tol);
      expect_close(g[1], tensor_of(training ? gw : gw_eval, {c}, dtype), tol, tol);
      expect_close(g[2], tensor_of(gb, {c}, dtype), tol, tol);
    }
  }
}

// A batch_norm double backward against PyTorch 1.13's (f64, eps 1e-3): the first gradients
// taken with create_graph, then the gradients of
// sum(gx * vx) + sum(gw * vw) + sum(gb * vb) for input, weight and the output gradient, from
// torch.autograd.grad(..., create_graph=True) and a second torch.autograd.grad.
TEST(LayersBatchNorm, DoubleBackwardMatchesPyTorch) {
  const Values x = {0.3, -1.2, 0.8, 1.5, -0.4, 0.9, 2.1, -0.7, 0.05, -1.6, 1.1, 0.45};
  const Values gy = {0.5, -0.25, 1.0, 0.75, -1.5, 0.3, 0.6, -0.8, 0.2, 1.2, -0.4, 0.9};
  const Values vx = {1.0, -0.5, 0.25, 0.8, -1.1, 0.6, 0.3, -0.2, 0.9, -0.7, 0.4, 1.3};
  struct Expected {
    bool training;
    Values gx, gw, gb, hx, hw, hgy;
  };
  const Expected cases[] = {
      {true,
       {0.396961364016227, -0.33590786213482815, -1.0220319409405019, -0.2205787936226677,
        -1.2884990095024802, 0.28300155912870517, 0.37108840624363876, 0.7228677361342233,
        0.1323288696192708, 0.8121150788731054, 1.2378888643632955, -1.0892342721779886},
       {-0.5161541458875719, 2.1850113830429585},
       {0.44999999999999996, 2.05},
       {-0.1350441089930568, 0.29013344292381155, -0.706259952557131, 0.21012058855980756,
        -0.2600838440851383, -0.45004019176491405, 0.3461553614770532, -0.3506243428634894,
        -0.07416896099898743, 0.6292036629182852, 0.6692623798693605, -0.16865403448560123},
       {2.4324008120853753, 1.0662054258254456},
       {0.566390832571463, -0.8452908732294204, 1.193597439177397, -0.18236721201956563,
        -1.2322949504431921, 0.3168485241959285, 0.07821219709143468, 3.062109859139591,
        0.45324279687569896, -1.0588963299704781, 0.7309551572059101, -0.08250744059476611}},
      {false,
       {0.39106755517316133, -0.19553377758658066, -1.098308348185747, -0.8237312611393103,
        -1.173202665519484, 0.23464053310389682, -0.6589850089114483, 0.8786466785485977,
        0.15642702206926454, 0.9385621324155873, 0.43932333927429884, -0.9884775133671724},
       {-0.7095082786713068, 3.4807926111732908},
       {0.44999999999999996, 2.05},
       {0.33520076157699547, -0.16760038078849773, -0.760367317974748, -0.570275488481061,
        -1.0056022847309865, 0.20112045694619726, -0.4562203907848488, 0.6082938543797984,
        0.1340803046307982, 0.804481827784789, 0.3041469271898992, -0.6843305861772732},
       {2.0056178901023562, 1.8586756661604953},
       {0.6162154149771208, -1.5625895352733497, -0.23494440502118463, -1.3712711191056692,
        -1.4955493829579505, 0.7056022847309864, -1.2783373357976446, 1.3998453286245234,
        0.37040152315399094, -1.9871771666042104, -0.6278008526414713, -1.1220396093250573}},
  };
  const Shape shape = {3, 2, 2};
  for (const Expected& e : cases) {
    SCOPED_TRACE(e.training ? "train" : "eval");
    Tensor xt = tensor_of(x, shape), w = tensor_of({0.7, -1.3}, {2}),
           b = tensor_of({0.2, 0.1}, {2});
    Tensor g = tensor_of(gy, shape);
    for (Tensor* t : {&xt, &w, &b, &g}) t->requires_grad_();
    const Tensor y = batch_norm(xt, w, b, tensor_of({0.1, -0.2}, {2}), tensor_of({0.8, 1.4}, {2}),
                                e.training, 0.1, 1e-3);
    y.backward(g, false, true);
    const Tensor gx = xt.grad(), gw = w.grad(), gb = b.grad();
    ASSERT_TRUE(gx.requires_grad() && gw.requires_grad() && gb.requires_grad());
    expect_close(gx, tensor_of(e.gx, shape), 1e-12, 1e-14);
    expect_close(gw, tensor_of(e.gw, {2}), 1e-12, 1e-14);
    expect_close(gb, tensor_of(e.gb, {2}), 1e-12, 1e-14);
    for (Tensor* t : {&xt, &w, &b, &g}) t->set_grad(Tensor());
    (sum(gx * tensor_of(vx, shape)) + sum(gw * tensor_of({0.6, -0.9}, {2})) +
     sum(gb * tensor_of({-0.3, 0.8}, {2})))
        .backward();
    expect_close(xt.grad(), tensor_of(e.hx, shape), 1e-12, 1e-14);
    expect_close(w.grad(), tensor_of(e.hw, {2}), 1e-12, 1e-14);
    expect_close(g.grad(), tensor_of(e.hgy, shape), 1e-12, 1e-14);
    EXPECT_FALSE(b.grad().defined());  // no first gradient depends on the bias
  }
}

// ---------------------------------------------------------------------------------------
// Pooling

struct PoolCase {
  Shape in;  // N, C, H, W
  Pair kernel, stride, padding, dilation;
  bool ceil_mode;
};

int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  const int64_t span = in + 2 * p - d * (k - 1) - 1;
  int64_t out = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

// Max pooling by loops: values, flat argmax per plane (first max wins, NaN wins), and the
// gradient for grad_out `gy`.
void ref_max_pool(const PoolCase& k, const Values& x, const Values& gy, Values& out,
                  std::vector<int64_t>& idx, Values& gx, Shape& out_shape) {
  const int64_t H = k.in[2], W = k.in[3], planes = k.in[0] * k.in[1];
  const int64_t ho =
      pool_out(H, k.kernel[0], k.stride[0], k.padding[0], k.dilation[0], k.ceil_mode);
  const int64_t wo =
      pool_out(W, k.kernel[1], k.stride[1], k.padding[1], k.dilation[1], k.ceil_mode);
  out_shape = {k.in[0], k.in[1], ho, wo};
  out.clear();
  idx.clear();
  gx.assign(x.size(), 0.0);
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t i = 0; i < ho; ++i) {
      for (int64_t j = 0; j < wo; ++j) {
        double best = -kInf;
        int64_t best_at = -1;
        for (int64_t u = 0; u < k.kernel[0]; ++u) {
          for (int64_t v = 0; v < k.kernel[1]; ++v) {
            const int64_t ih = i * k.stride[0] - k.padding[0] + u * k.dilation[0];
            const int64_t iw = j * k.stride[1] - k.padding[1] + v * k.dilation[1];
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            const double val = x[static_cast<size_t>(p * H * W + ih * W + iw)];
            if (std::isnan(best)) continue;
            if (best_at < 0 || val > best || std::isnan(val)) {
              best = val;
              best_at = ih * W + iw;
            }
          }
        }
        out.push_back(best);
        idx.push_back(best_at);
        if (!gy.empty()) gx[static_cast<size_t>(p * H * W + best_at)] += gy[out.size() - 1];
      }
    }
  }
}

detail::Pool2dParams pool_params(const PoolCase& k) {
  detail::Pool2dParams p;
  for (size_t i = 0; i < 2; ++i) {
    p.kernel[i] = k.kernel[i];
    p.stride[i] = k.stride[i];
    p.padding[i] = k.padding[i];
    p.dilation[i] = k.dilation[i];
  }
  return p;
}

TEST(LayersMaxPool, ForwardAndBackwardMatchReference) {
  const std::vector<PoolCase> cases = {
      {{2, 3, 6, 6}, {2, 2}, {2, 2}, {0, 0}, {1, 1}, false},
      {{1, 2, 7, 5}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, false},
      {{1, 2, 7, 5}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true},
      {{2, 1, 8, 9}, {2, 3}, {1, 2}, {1, 1}, {2, 1}, false},
      {{1, 2, 5, 6}, {2, 2}, {2, 2}, {0, 1}, {1, 1}, true},
  };
  unsigned seed = 30;
  for (const PoolCase& k : cases) {
    // Negative values everywhere: a padding position (0) must never win.
    const Values x = random_values(numel_of(k.in), ++seed, -3.0, -0.5);
    Values out, gx;
    std::vector<int64_t> idx;
    Shape out_shape;
    ref_max_pool(k, x, {}, out, idx, gx, out_shape);
    const Values gy = random_values(numel_of(out_shape), ++seed);
    ref_max_pool(k, x, gy, out, idx, gx, out_shape);
    for (DType dtype : {kF64, kF32}) {
      SCOPED_TRACE(::testing::Message()
                   << dtype << " in " << shape_str(k.in) << " ceil " << k.ceil_mode);
      const Tensor y = max_pool2d(tensor_of(x, k.in, dtype), k.kernel, k.stride, k.padding,
                                  k.dilation, k.ceil_mode);
      expect_close(y, tensor_of(out, out_shape, dtype), 0, 0);
      const Tensor g = detail::max_pool2d_backward(tensor_of(gy, out_shape, dtype), k.in,
                                                   from_vector(idx, out_shape), pool_params(k));
      expect_close(g, tensor_of(gx, k.in, dtype), tol_for(dtype), tol_for(dtype));
    }
  }
}

TEST(LayersMaxPool, NanWinsAndPaddingNeverWins) {
  const Values x = {1.0, 5.0, 5.0, 2.0, kNaN, 0.0, -1.0, 3.0, 3.0};
  const auto v = max_pool2d(tensor_of(x, {1, 1, 3, 3}), {2, 2}, {1, 1}).to_vector<double>();
  ASSERT_EQ(v.size(), 4u);
  for (double value : v) EXPECT_TRUE(std::isnan(value));
  // Padded windows of an all-negative plane still pick input values.
  const Tensor neg = tensor_of({-4.0, -3.0, -2.0, -1.0}, {1, 1, 2, 2});
  EXPECT_EQ(max_pool2d(neg, {2, 2}, {1, 1}, {1, 1}).to_vector<double>(),
            (Values{-4, -3, -3, -2, -1, -1, -2, -1, -1}));
}

struct AvgCase {
  Shape in;
  Pair kernel, stride, padding;
  bool ceil_mode, count_include_pad;
};

// Average pooling by loops, PyTorch's divisor rules; gradient for `gy`.
void ref_avg_pool(const AvgCase& k, const Values& x, const Values& gy, Values& out, Values& gx,
                  Shape& out_shape) {
  const int64_t H = k.in[2], W = k.in[3], planes = k.in[0] * k.in[1];
  const int64_t ho = pool_out(H, k.kernel[0], k.stride[0], k.padding[0], 1, k.ceil_mode);
  const int64_t wo = pool_out(W, k.kernel[1], k.stride[1], k.padding[1], 1, k.ceil_mode);
  out_shape = {k.in[0], k.in[1], ho, wo};
  out.clear();
  gx.assign(x.size(), 0.0);
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t i = 0; i < ho; ++i) {
      for (int64_t j = 0; j < wo; ++j) {
        const int64_t h0 = i * k.stride[0] - k.padding[0], w0 = j * k.stride[1] - k.padding[1];
        const int64_t h1 = std::min(h0 + k.kernel[0], H + k.padding[0]);
        const int64_t w1 = std::min(w0 + k.kernel[1], W + k.padding[1]);
        double sum = 0;
        int64_t inside = 0;
        for (int64_t ih = std::max<int64_t>(h0, 0); ih < std::min(h1, H); ++ih) {
          for (int64_t iw = std::max<int64_t>(w0, 0); iw < std::min(w1, W); ++iw) {
            sum += x[static_cast<size_t>(p * H * W + ih * W + iw)];
            ++inside;
          }
        }
        const double divisor = k.count_include_pad ? static_cast<double>((h1 - h0) * (w1 - w0))
                                                   : static_cast<double>(inside);
        out.push_back(sum / divisor);
        if (gy.empty()) continue;
        for (int64_t ih = std::max<int64_t>(h0, 0); ih < std::min(h1, H); ++ih) {
          for (int64_t iw = std::max<int64_t>(w0, 0); iw < std::min(w1, W); ++iw) {
            gx[static_cast<size_t>(p * H * W + ih * W + iw)] += gy[out.size() - 1] / divisor;
          }
        }
      }
    }
  }
}

TEST(LayersAvgPool, ForwardAndBackwardMatchReference) {
  const std::vector<AvgCase> cases = {
      {{2, 3, 6, 6}, {2, 2}, {2, 2}, {0, 0}, false, true},
      {{1, 2, 7, 5}, {3, 3}, {2, 2}, {1, 1}, false, true},
      {{1, 2, 7, 5}, {3, 3}, {2, 2}, {1, 1}, false, false},
      {{1, 2, 7, 5}, {3, 3}, {2, 2}, {1, 1}, true, true},
      {{1, 2, 7, 5}, {3, 3}, {2, 2}, {1, 1}, true, false},
      {{2, 1, 5, 8}, {2, 3}, {2, 3}, {1, 1}, true, true},  // last windows clipped at H + pad
      {{1, 1, 6, 6}, {4, 4}, {3, 3}, {2, 2}, true, true},
  };
  unsigned seed = 70;
  for (const AvgCase& k : cases) {
    const Values x = random_values(numel_of(k.in), ++seed);
    Values out, gx;
    Shape out_shape;
    ref_avg_pool(k, x, {}, out, gx, out_shape);
    const Values gy = random_values(numel_of(out_shape), ++seed);
    ref_avg_pool(k, x, gy, out, gx, out_shape);
    for (DType dtype : {kF64, kF32}) {
      SCOPED_TRACE(::testing::Message() << dtype << " in " << shape_str(k.in) << " ceil "
                                        << k.ceil_mode << " include_pad " << k.count_include_pad);
      const Tensor y = avg_pool2d(tensor_of(x, k.in, dtype), k.kernel, k.stride, k.padding,
                                  k.ceil_mode, k.count_include_pad);
      expect_close(y, tensor_of(out, out_shape, dtype), tol_for(dtype), tol_for(dtype));
      detail::Pool2dParams params;
      for (size_t i = 0; i < 2; ++i) {
        params.kernel[i] = k.kernel[i];
        params.stride[i] = k.stride[i];
        params.padding[i] = k.padding[i];
      }
      params.count_include_pad = k.count_include_pad;
      const Tensor g = detail::avg_pool2d_backward(tensor_of(gy, out_shape, dtype), k.in, params);
      expect_close(g, tensor_of(gx, k.in, dtype), tol_for(dtype), tol_for(dtype));
    }
  }
}

TEST(LayersAdaptiveAvgPool, ForwardAndBackwardMatchReference) {
  const std::vector<std::pair<Shape, Pair>> cases = {{{2, 3, 8, 8}, {1, 1}},
                                                     {{1, 2, 7, 5}, {3, 2}},
                                                     {{1, 1, 5, 7}, {5, 7}},
                                                     {{1, 2, 3, 4}, {5, 6}}};
  unsigned seed = 90;
  for (const auto& [in, os] : cases) {
    const int64_t H = in[2], W = in[3], planes = in[0] * in[1];
    const Shape out_shape{in[0], in[1], os[0], os[1]};
    const Values x = random_values(numel_of(in), ++seed),
                 gy = random_values(numel_of(out_shape), ++seed);
    Values out, gx(x.size(), 0.0);
    for (int64_t p = 0; p < planes; ++p) {
      for (int64_t i = 0; i < os[0]; ++i) {
        const auto h0 = static_cast<int64_t>(
            std::floor(static_cast<double>(i * H) / static_cast<double>(os[0])));
        const auto h1 = static_cast<int64_t>(
            std::ceil(static_cast<double>((i + 1) * H) / static_cast<double>(os[0])));
        for (int64_t j = 0; j < os[1]; ++j) {
          const auto w0 = static_cast<int64_t>(
              std::floor(static_cast<double>(j * W) / static_cast<double>(os[1])));
          const auto w1 = static_cast<int64_t>(
              std::ceil(static_cast<double>((j + 1) * W) / static_cast<double>(os[1])));
          double sum = 0;
          for (int64_t ih = h0; ih < h1; ++ih)
            for (int64_t iw = w0; iw < w1; ++iw)
              sum += x[static_cast<size_t>(p * H * W + ih * W + iw)];
          const double count = static_cast<double>((h1 - h0) * (w1 - w0));
          out.push_back(sum / count);
          for (int64_t ih = h0; ih < h1; ++ih)
            for (int64_t iw = w0; iw < w1; ++iw)
              gx[static_cast<size_t>(p * H * W + ih * W + iw)] += gy[out.size() - 1] / count;
        }
      }
    }
    for (DType dtype : {kF64, kF32}) {
      SCOPED_TRACE(::testing::Message() << dtype << " in " << shape_str(in));
      const Tensor y = adaptive_avg_pool2d(tensor_of(x, in, dtype), os);
      expect_close(y, tensor_of(out, out_shape, dtype), tol_for(dtype), tol_for(dtype));
      const Tensor g = detail::adaptive_avg_pool2d_backward(tensor_of(gy, out_shape, dtype), in);
      expect_close(g, tensor_of(gx, in, dtype), tol_for(dtype), tol_for(dtype));
    }
  }
}

// ---------------------------------------------------------------------------------------
// cross_entropy

TEST(LayersCrossEntropy, SmoothingIgnoreIndexAndReductions) {
  const int64_t n = 5, c = 4;
  Values logits = random_values(n * c, 11, -3.0, 3.0);
  logits[0] = 80.0;  // large values: the log-sum-exp must stay finite
  const std::vector<int64_t> target = {0, 3, -1, 2, 1};
  const Tensor t = from_vector(target, {n});
  for (double s : {0.0, 0.2}) {
    for (int64_t ignore : {-100, -1}) {
      Values per(static_cast<size_t>(n), 0.0), grad(logits.size(), 0.0),
          lses(static_cast<size_t>(n), 0.0);
      const Values grad_loss = {0.5, -1.0, 2.0, 1.5, 3.0};
      int64_t kept = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (target[static_cast<size_t>(i)] == ignore) continue;
        ++kept;
        double m = -kInf;
        for (int64_t j = 0; j < c; ++j) m = std::max(m, logits[static_cast<size_t>(i * c + j)]);
        double e = 0;
        for (int64_t j = 0; j < c; ++j) e += std::exp(logits[static_cast<size_t>(i * c + j)] - m);
        const double lse = m + std::log(e);
        lses[static_cast<size_t>(i)] = lse;
        // (1 - s) * nll + s * mean over classes of -log p
        double smooth = 0;
        for (int64_t j = 0; j < c; ++j) {
          const double logp = logits[static_cast<size_t>(i * c + j)] - lse;
          smooth -= logp / static_cast<double>(c);
        }
        const double nll =
            lse - logits[static_cast<size_t>(i * c + target[static_cast<size_t>(i)])];
        per[static_cast<size_t>(i)] = (1 - s) * nll + s * smooth;
        for (int64_t j = 0; j < c; ++j) {
          const double p = std::exp(logits[static_cast<size_t>(i * c + j)] - lse);
          grad[static_cast<size_t>(i * c + j)] =
              grad_loss[static_cast<size_t>(i)] *
              (p - s / static_cast<double>(c) -
               (j == target[static_cast<size_t>(i)] ? 1 - s : 0.0));
        }
      }
      for (DType dtype : {kF64, kF32}) {
        SCOPED_TRACE(::testing::Message() << dtype << " smoothing " << s << " ignore " << ignore);
        const double tol = tol_for(dtype) * 10;
        const Tensor x = tensor_of(logits, {n, c}, dtype);
        if (ignore == -100) {
          // -1 is not ignored then, and out of range: rejected by the front end.
          EXPECT_EMBER_ERROR(
              cross_entropy(
                  x, t,
                  {.ignore_index = ignore, .reduction = Reduction::kNone, .label_smoothing = s}),
              "out of range");
          continue;
        }
        expect_close(
            cross_entropy(
                x, t,
                {.ignore_index = ignore, .reduction = Reduction::kNone, .label_smoothing = s}),
            tensor_of(per, {n}, dtype), tol, tol);
        const double sum = std::accumulate(per.begin(), per.end(), 0.0);
        EXPECT_NEAR(
            cross_entropy(
                x, t, {.ignore_index = ignore, .reduction = Reduction::kSum, .label_smoothing = s})
                .item<double>(),
            sum, tol * 10);
        EXPECT_NEAR(
            cross_entropy(x, t, {.ignore_index = ignore, .label_smoothing = s}).item<double>(),
            sum / static_cast<double>(kept), tol * 10);
        const Tensor g = detail::cross_entropy_backward(tensor_of(grad_loss, {n}, dtype), x,
                                                        tensor_of(lses, {n}, dtype), t, ignore, s);
        expect_close(g, tensor_of(grad, {n, c}, dtype), tol, tol);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Finite-difference gradients (f64) of every layer op.

using autograd::gradcheck;
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

Tensor leaf(const Shape& shape, unsigned seed, double lo = -1.0, double hi = 1.0) {
  Tensor t = tensor_of(random_values(numel_of(shape), seed, lo, hi), shape);
  t.requires_grad_();
  return t;
}

void check_grad(const char* name, const Fn& f, const std::vector<Tensor>& inputs) {
  SCOPED_TRACE(name);
  const auto result = gradcheck(f, inputs);
  EXPECT_TRUE(result.ok) << result.message;
}

// gradcheck, then gradgradcheck: the gradients a create_graph backward records are checked
// as functions of the inputs and of the output's gradient (second derivatives).
void check_grad_twice(const char* name, const Fn& f, const std::vector<Tensor>& inputs) {
  check_grad(name, f, inputs);
  SCOPED_TRACE(name);
  const auto second = autograd::gradgradcheck(f, inputs);
  EXPECT_TRUE(second.ok) << second.message;
}

Tensor channels_last(const Tensor& t) { return t.contiguous(MemoryFormat::ChannelsLast); }

TEST(LayersGradcheck, Conv2d) {
  check_grad_twice("conv2d stride/padding/bias",
                   [](const auto& v) {
                     return conv2d(v[0], v[1], v[2], {2, 1}, {1, 1});
                   },
                   {leaf({2, 3, 5, 4}, 1), leaf({4, 3, 3, 2}, 2), leaf({4}, 3)});
  check_grad_twice("conv2d dilation/groups",
                   [](const auto& v) {
                     return conv2d(v[0], v[1], {}, {1, 1}, {1, 0}, {2, 1}, 2);
                   },
                   {leaf({1, 4, 6, 5}, 4), leaf({2, 2, 2, 2}, 5)});
  check_grad_twice("conv2d pointwise", [](const auto& v) { return conv2d(v[0], v[1], v[2]); },
                   {leaf({2, 3, 3, 3}, 6), leaf({2, 3, 1, 1}, 7), leaf({2}, 8)});
  check_grad_twice(
      "conv2d channels_last stride/padding/groups/bias",
      [](const auto& v) {
        return conv2d(channels_last(v[0]), channels_last(v[1]), v[2], {1, 2}, {1, 1}, {1, 1}, 2);
      },
      {leaf({2, 4, 4, 5}, 21), leaf({4, 2, 2, 3}, 22), leaf({4}, 23)});
  // Only the input, or only the weight, requires grad: each gradient op alone.
  const Tensor w = tensor_of(random_values(24, 24), {2, 3, 2, 2});
  check_grad_twice("conv2d input only",
                   [w](const auto& v) {
                     return conv2d(v[0], w, {}, {2, 2}, {1, 1}, {2, 1});
                   },
                   {leaf({1, 3, 5, 5}, 25)});
  const Tensor x = tensor_of(random_values(75, 26), {1, 3, 5, 5});
  check_grad_twice("conv2d weight only",
                   [x](const auto& v) {
                     return conv2d(x, v[0], {}, {2, 2}, {1, 1}, {2, 1});
                   },
                   {leaf({2, 3, 2, 2}, 27)});
}

// First and (through a create_graph backward) second derivatives, training and eval, with and
// without the affine parameters.
TEST(LayersGradcheck, BatchNorm) {
  const Tensor rm = zeros({3}, kF64), rv = ones({3}, kF64);
  const std::vector<std::tuple<const char*, Fn, std::vector<Tensor>>> cases = {
      {"batch_norm train",
       [&](const auto& v) { return batch_norm(v[0], v[1], v[2], {}, {}, true, 0.1, 1e-3); },
       {leaf({4, 3, 2, 2}, 9), leaf({3}, 10), leaf({3}, 11)}},
      {"batch_norm train 2-d",
       [&](const auto& v) { return batch_norm(v[0], {}, {}, {}, {}, true); },
       {leaf({5, 3}, 12)}},
      {"batch_norm train weight, running stats",
       [&](const auto& v) {
         return batch_norm(v[0], v[1], {}, rm.clone(), rv.clone(), true, 0.1, 1e-3);
       },
       {leaf({3, 3, 4}, 16), leaf({3}, 17)}},
      {"batch_norm eval",
       [&](const auto& v) { return batch_norm(v[0], v[1], v[2], rm, rv, false); },
       {leaf({2, 3, 2}, 13), leaf({3}, 14), leaf({3}, 15)}},
      {"batch_norm eval bias",
       [&](const auto& v) { return batch_norm(v[0], {}, v[1], rm, rv, false); },
       {leaf({2, 3, 2, 2}, 18), leaf({3}, 19)}},
  };
  for (const auto& [name, f, inputs] : cases) check_grad_twice(name, f, inputs);
}

TEST(LayersGradcheck, Pooling) {
  // Distinct values at least 1e-2 apart: finite differences never swap a max.
  Values spread(2 * 2 * 5 * 6);
  std::iota(spread.begin(), spread.end(), 0.0);
  std::shuffle(spread.begin(), spread.end(), std::mt19937(16));
  for (auto& s : spread) s *= 0.01;
  Tensor x = tensor_of(spread, {2, 2, 5, 6});
  x.requires_grad_();
  check_grad_twice("max_pool2d",
                   [](const auto& v) {
                     return max_pool2d(v[0], {3, 2}, {2, 2}, {1, 1}, {1, 2}, true);
                   },
                   {x});
  check_grad_twice("max_pool2d channels_last",
                   [](const auto& v) {
                     return max_pool2d(channels_last(v[0]), {2, 3}, {1, 2});
                   },
                   {x});
  check_grad_twice("avg_pool2d",
                   [](const auto& v) {
                     return avg_pool2d(v[0], {3, 3}, {2, 2}, {1, 1}, true, false);
                   },
                   {leaf({2, 2, 5, 6}, 17)});
  check_grad_twice("avg_pool2d channels_last, counting padding",
                   [](const auto& v) {
                     return avg_pool2d(channels_last(v[0]), {2, 3}, {2, 1}, {1, 1});
                   },
                   {leaf({2, 3, 5, 4}, 28)});
  check_grad_twice("adaptive_avg_pool2d",
                   [](const auto& v) {
                     return adaptive_avg_pool2d(v[0], {3, 4});
                   },
                   {leaf({2, 2, 5, 6}, 18)});
  check_grad_twice("adaptive_avg_pool2d channels_last",
                   [](const auto& v) {
                     return adaptive_avg_pool2d(channels_last(v[0]), {2, 3});
                   },
                   {leaf({1, 3, 5, 7}, 29)});
}

// The op that computed a leaf's gradient under create_graph (behind the expand and clone the
// leaf's copy of it takes).
std::string recorded_by(const Tensor& grad) {
  const autograd::Node* node = grad.grad_fn().get();
  while (node->name() == "CloneBackward" || node->name() == "ExpandBackward")
    node = node->next_edges().at(0).node.get();
  return node->name();
}

// Without create_graph, conv2d's and the pools' gradients are the fused kernels' bits; with it,
// they are recorded ops (differentiable again) of the same values.
TEST(LayersSecondDerivatives, FirstOrderGradientsAreTheFusedKernels) {
  const ConvCase k{2, 4, 6, 5, 6, 3, 2, {2, 1}, {1, 1}, {1, 2}, 2, true};
  for (const DType dtype : {kF32, kF64}) {
    for (const bool cl : {false, true}) {
      SCOPED_TRACE(::testing::Message() << dtype << (cl ? " channels_last" : ""));
      const auto format = cl ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
      Tensor x =
          tensor_of(random_values(2 * 4 * 6 * 5, 30), {2, 4, 6, 5}, dtype).contiguous(format);
      Tensor w =
          tensor_of(random_values(6 * 2 * 3 * 2, 31), {6, 2, 3, 2}, dtype).contiguous(format);
      Tensor b = tensor_of(random_values(6, 32), {6}, dtype);
      for (Tensor* t : {&x, &w, &b}) t->requires_grad_();
      auto forward = [&] { return conv2d(x, w, b, k.stride, k.padding, k.dilation, k.groups); };
      const Tensor gy = tensor_of(random_values(2 * 6 * 3 * 5, 33), {2, 6, 3, 5}, dtype);
      detail::Conv2dParams params = conv_params(k);
      params.channels_last = cl;
      const auto fused =
          detail::conv2d_backward(gy, x.detach(), w.detach(), params, {true, true, true});
      for (const bool create_graph : {false, true}) {
        for (Tensor* t : {&x, &w, &b}) t->set_grad(Tensor());
        forward().backward(gy, false, create_graph);
        const double tol = create_graph ? tol_for(dtype) : 0.0;
        expect_close(x.grad(), fused[0], tol, tol);
        expect_close(w.grad(), fused[1], tol, tol);
        expect_close(b.grad(), fused[2], tol, tol);
        ASSERT_EQ(x.grad().requires_grad(), create_graph);
        if (create_graph) {
          EXPECT_EQ(recorded_by(x.grad()), "ConvolutionBackwardInputBackward");
          EXPECT_EQ(recorded_by(w.grad()), "ConvolutionBackwardWeightBackward");
        }
      }

      // The pools' gradients are one kernel call either way, recorded under create_graph (they
      // depend on the output's gradient alone, which requires grad here).
      const Tensor p = tensor_of(random_values(2 * 3 * 5 * 6, 34), {2, 3, 5, 6}, dtype)
                           .contiguous(format)
                           .requires_grad_();
      const Tensor pgy =
          tensor_of(random_values(2 * 3 * 3 * 3, 35), {2, 3, 3, 3}, dtype).requires_grad_();
      const std::vector<std::pair<std::function<Tensor()>, const char*>> pools = {
          {[&] {
             return max_pool2d(p, {2, 2}, {2, 2}, {1, 0});
           },
           "MaxPool2dBackwardBackward"},
          {[&] {
             return avg_pool2d(p, {2, 2}, {2, 2}, {1, 0});
           },
           "AvgPool2dBackwardBackward"},
          {[&] {
             return adaptive_avg_pool2d(p, {3, 3});
           },
           "AdaptiveAvgPool2dBackwardBackward"}};
      for (const auto& [f, node] : pools) {
        SCOPED_TRACE(node);
        p.set_grad(Tensor());
        f().backward(pgy);
        const Tensor first_order = p.grad();
        p.set_grad(Tensor());
        f().backward(pgy, false, true);
        expect_close(p.grad(), first_order, 0.0, 0.0);
        ASSERT_TRUE(p.grad().requires_grad());
        EXPECT_EQ(recorded_by(p.grad()), node);
      }
    }
  }
}

// PyTorch 1.13, f64: x[i] = sin(0.37 i + 0.1) [1, 4, 4, 4], w[i] = 0.5 cos(0.53 i) [2, 2, 2, 2],
// b = {0.1, 0.2}, y = F.conv2d(x, w, b, stride=(2, 1), padding=(1, 0), dilation=(1, 2),
// groups=2); gx = autograd.grad((y ** 2).sum(), x, create_graph=True); the gradients of
// (gx ** 2).sum() for w, b and x.
TEST(LayersSecondDerivatives, Conv2dDoubleBackwardMatchesPyTorch) {
  const Values gw_ref = {
      6.078453082704204,  3.8207141683026715, -0.6677943691007547, -4.306550170479987,
      5.146743246627698,  4.089094216293118,  0.19279997862300724, -3.486194305861,
      8.35633932874392,   14.895657848316791, 12.124435353667518,  6.471412996444459,
      17.596258783212306, 21.618419647181202, 13.984561351834682,  2.5552324671594864};
  const Values gb_ref = {3.9108715372216585, 11.135138069771223};
  const Values gx_ref = {
      0.05127978608053272,  -0.15927236925370583, -0.0020142277801264924, 0.006256087540099311,
      0.9300333068611372,   1.576931122205481,    0.8024393129740135,     1.3605873219536657,
      0.4546673189248349,   0.7709176006632513,   -0.017858957973338727,  -0.03028100868060897,
      -0.28017455329637236, -0.05045259287743954, -0.24173658556242483,   -0.04353085386045751,
      -0.10481672118897803, 0.3255553269070932,   -0.08840046505396312,   0.2745672825187391,
      -0.48548498934768014, -0.8231709374471479,  -0.8199008049025852,    -1.3901944014627179,
      -0.9293474338337079,  -1.57576818049699,    -0.7837942688503593,    -1.3289734537872486,
      0.14625340729102462,  0.0263366659397756,   0.24699689792423385,    0.04447810761664633,
      -0.05440698378641633, 0.15218362672632485,  -0.08823457091532046,   0.24680392240172433,
      -1.5687205750948232,  -1.3504712620154637,  0.1985113035293768,     0.1708932839014033,
      1.9112744876193195,   1.6453671293226981,   3.0996109796954734,     2.668375501642993,
      0.1662014947358667,   0.2999156372340955,   -0.021031709465883345,  -0.037952357508019056,
      -0.04126708120652767, 0.11542955785001813,  0.009408888184605021,   -0.0263179214825938,
      3.4374580506335617,   2.959219369889197,    2.8321152416735744,     2.4380952894462764,
      1.4496800594236028,   1.2479923387567646,   -0.3305268311636897,    -0.28454206179109937,
      -0.36418892897647054, -0.6571899661983585,  -0.3000545756225109,    -0.541457580726626};
  auto values = [](int64_t n, auto f) {
    Values v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = f(static_cast<double>(i));
    return v;
  };
  for (const bool cl : {false, true}) {
    SCOPED_TRACE(cl ? "channels_last" : "contiguous");
    const auto format = cl ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
    Tensor x =
        tensor_of(values(64, [](double i) { return std::sin(0.37 * i + 0.1); }), {1, 4, 4, 4})
            .contiguous(format)
            .requires_grad_();
    Tensor w =
        tensor_of(values(16, [](double i) { return 0.5 * std::cos(0.53 * i); }), {2, 2, 2, 2})
            .contiguous(format)
            .requires_grad_();
    Tensor b = tensor_of({0.1, 0.2}, {2}).requires_grad_();
    const Tensor y = conv2d(x, w, b, {2, 1}, {1, 0}, {1, 2}, 2);
    (y * y).sum().backward({}, false, true);
    const Tensor gx = x.grad();
    for (Tensor* t : {&x, &w, &b}) t->set_grad(Tensor());
    const Tensor loss = (gx * gx).sum();
    EXPECT_NEAR(loss.item<double>(), 7.669367670681535, 1e-12);
    loss.backward();
    expect_close(w.grad(), tensor_of(gw_ref, {2, 2, 2, 2}), 1e-12, 1e-12);
    expect_close(b.grad(), tensor_of(gb_ref, {2}), 1e-12, 1e-12);
    expect_close(x.grad(), tensor_of(gx_ref, {1, 4, 4, 4}), 1e-12, 1e-12);
  }
}

TEST(LayersGradcheck, CrossEntropy) {
  const Tensor t = from_vector(std::vector<int64_t>{2, 0, 7, 1}, {4});
  check_grad_twice("cross_entropy mean smoothing",
                   [&](const auto& v) {
                     return cross_entropy(v[0], t, {.ignore_index = 7, .label_smoothing = 0.1});
                   },
                   {leaf({4, 3}, 19, -2.0, 2.0)});
  check_grad_twice("cross_entropy none",
                   [&](const auto& v) {
                     return cross_entropy(v[0], t,
                                          {.ignore_index = 7, .reduction = Reduction::kNone});
                   },
                   {leaf({4, 3}, 20, -2.0, 2.0)});
}

}  // namespace
}  // namespace ember
