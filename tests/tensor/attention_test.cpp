// scaled_dot_product_attention: the fused op against softmax(q k^T * scale + mask) v composed
// from ember's own ops (forward and backward, tile-crossing lengths, causal or not), PyTorch
// 1.13's values (golden/attention_golden.json, written by make_attention_golden.py), f64
// gradcheck, the dropout mask rule and its reproducibility, 16-bit inputs, what the CPU path
// allocates at L = 2048, and the errors.
#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <vector>

#include <ember/autograd/gradcheck.h>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace ember {
namespace {

using nlohmann::json;
using testing::expect_close;

Tensor input(const Shape& shape, uint64_t seed, DType dtype = kF64) {
  Generator gen(seed);
  return uniform(shape, -1.0, 1.0, kF64, &gen).to(dtype);
}

// The definition, from ember's ops: softmax(q k^T * scale + mask) (* keep / (1 - p)) v.
Tensor naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                       std::optional<double> scale = std::nullopt, const Tensor& keep = {},
                       double p = 0.0) {
  const double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  Tensor scores = matmul(q, k.transpose(-2, -1)) * s;
  if (causal) {
    const int64_t lq = q.size(-2), lk = k.size(-2);
    const Tensor above = gt(arange(lk).view({1, lk}), arange(lq).view({lq, 1}));
    scores = masked_fill(scores, above, -std::numeric_limits<double>::infinity());
  }
  Tensor weights = softmax(scores, -1);
  if (keep.defined()) weights = weights * keep.to(weights.dtype()) / (1.0 - p);
  return matmul(weights, v);
}

struct Grads {
  Tensor out, q, k, v;
};

// Forward, then backward of sum(out * grad_out), on fresh leaves.
Grads run(const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>& f,
          const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& grad_out) {
  Tensor ql = q.clone().requires_grad_(), kl = k.clone().requires_grad_(),
         vl = v.clone().requires_grad_();
  Tensor out = f(ql, kl, vl);
  out.backward(grad_out);
  return {out.detach(), ql.grad(), kl.grad(), vl.grad()};
}

void expect_same(const Grads& a, const Grads& b, double rtol, double atol) {
  {
    SCOPED_TRACE("output");
    expect_close(a.out, b.out, rtol, atol);
  }
  {
    SCOPED_TRACE("grad q");
    expect_close(a.q, b.q, rtol, atol);
  }
  {
    SCOPED_TRACE("grad k");
    expect_close(a.k, b.k, rtol, atol);
  }
  {
    SCOPED_TRACE("grad v");
    expect_close(a.v, b.v, rtol, atol);
  }
}

TEST(Attention, MatchesNaiveCompositionForwardAndBackward) {
  uint64_t seed = 1;
  for (DType dtype : {kF64, kF32}) {
    const double tol = dtype == kF64 ? 1e-11 : 2e-5;
    for (int64_t length : {1, 7, 63, 64, 65, 130}) {
      for (int64_t dim : {8, 16, 64}) {
        for (bool causal : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << dtype << " L " << length << " D " << dim << (causal ? " causal" : ""));
          const Shape shape = {1, 2, length, dim};
          const Tensor q = input(shape, seed++, dtype), k = input(shape, seed++, dtype),
                       v = input(shape, seed++, dtype), g = input(shape, seed++, dtype);
          const Grads fused =
              run([&](const Tensor& a, const Tensor& b,
                      const Tensor& c) { return scaled_dot_product_attention(a, b, c, causal); },
                  q, k, v, g);
          const Grads naive = run([&](const Tensor& a, const Tensor& b,
                                      const Tensor& c) { return naive_attention(a, b, c, causal); },
                                  q, k, v, g);
          expect_same(fused, naive, tol, tol);
        }
      }
    }
  }
}

// Lq != Lk, E != Ev, an explicit scale, and 2-d and 3-d inputs.
TEST(Attention, OtherShapesAndScale) {
  struct Case {
    Shape q, k, v;
    bool causal;
    std::optional<double> scale;
  };
  const Case cases[] = {
      {{3, 5, 4}, {3, 70, 4}, {3, 70, 6}, false, std::nullopt},
      {{3, 70, 4}, {3, 5, 4}, {3, 5, 6}, true, 0.7},
      {{9, 3}, {12, 3}, {12, 5}, true, std::nullopt},
      {{2, 1, 2, 66, 8}, {2, 1, 2, 66, 8}, {2, 1, 2, 66, 3}, true, -0.2},
  };
  uint64_t seed = 500;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << shape_str(c.q) << " " << shape_str(c.k) << " "
                                      << shape_str(c.v) << (c.causal ? " causal" : ""));
    const Tensor q = input(c.q, seed++), k = input(c.k, seed++), v = input(c.v, seed++);
    Shape out_shape = c.q;
    out_shape.back() = c.v.back();
    const Tensor g = input(out_shape, seed++);
    const Grads fused = run(
        [&](const Tensor& a, const Tensor& b, const Tensor& d) {
          return scaled_dot_product_attention(a, b, d, c.causal, 0.0, c.scale);
        },
        q, k, v, g);
    const Grads naive =
        run([&](const Tensor& a, const Tensor& b,
                const Tensor& d) { return naive_attention(a, b, d, c.causal, c.scale); },
            q, k, v, g);
    expect_same(fused, naive, 1e-11, 1e-11);
  }
}

TEST(Attention, NonContiguousInputs) {
  // [B, L, H, D] transposed to [B, H, L, D], as a multi-head layer produces them.
  const Tensor q = input({2, 9, 3, 8}, 600).transpose(1, 2),
               k = input({2, 9, 3, 8}, 601).transpose(1, 2),
               v = input({2, 9, 3, 8}, 602).transpose(1, 2);
  expect_close(scaled_dot_product_attention(q, k, v, true), naive_attention(q, k, v, true), 1e-12,
               1e-12);
}

TEST(Attention, Gradcheck) {
  for (bool causal : {false, true}) {
    for (double p : {0.0, 0.3}) {
      SCOPED_TRACE(::testing::Message() << (causal ? "causal" : "full") << " dropout " << p);
      const std::vector<Tensor> inputs = {input({1, 2, 5, 3}, 700).requires_grad_(),
                                          input({1, 2, 6, 3}, 701).requires_grad_(),
                                          input({1, 2, 6, 4}, 702).requires_grad_()};
      const auto result = autograd::gradcheck(
          [&](const std::vector<Tensor>& x) {
            Generator gen(42);  // the same mask on every evaluation
            return scaled_dot_product_attention(x[0], x[1], x[2], causal, p, std::nullopt, &gen);
          },
          inputs);
      EXPECT_TRUE(result) << result.message;
    }
  }
}

// ---------------------------------------------------------------------------------------
// PyTorch 1.13's values.

const json& golden() {
  static const json data = [] {
    std::ifstream in(EMBER_ATTENTION_GOLDEN);
    EXPECT_TRUE(in.good()) << "cannot open " << EMBER_ATTENTION_GOLDEN;
    return json::parse(in);
  }();
  return data;
}

Tensor tensor_from(const json& j, DType dtype) {
  return from_vector(j.at("values").get<std::vector<double>>())
      .reshape(j.at("shape").get<Shape>())
      .to(dtype);
}

TEST(Attention, MatchesPyTorch) {
  const json& cases = golden().at("cases");
  ASSERT_GE(cases.size(), 16u);
  for (const json& c : cases) {
    const DType dtype = c.at("dtype") == "f64" ? kF64 : kF32;
    const bool causal = c.at("causal").get<bool>();
    const std::optional<double> scale =
        c.contains("scale") ? std::optional<double>(c.at("scale").get<double>()) : std::nullopt;
    const Tensor q = tensor_from(c.at("q"), dtype);
    SCOPED_TRACE(::testing::Message()
                 << dtype << " q " << shape_str(q.sizes()) << (causal ? " causal" : ""));
    const Grads got = run(
        [&](const Tensor& a, const Tensor& b, const Tensor& d) {
          return scaled_dot_product_attention(a, b, d, causal, 0.0, scale);
        },
        q, tensor_from(c.at("k"), dtype), tensor_from(c.at("v"), dtype),
        tensor_from(c.at("grad_output"), dtype));
    const Grads want{tensor_from(c.at("out"), dtype), tensor_from(c.at("grad_q"), dtype),
                     tensor_from(c.at("grad_k"), dtype), tensor_from(c.at("grad_v"), dtype)};
    const double tol = dtype == kF64 ? 1e-12 : 2e-5;
    expect_same(got, want, tol, tol);
  }
}

// ---------------------------------------------------------------------------------------
// Dropout on the weights.

TEST(Attention, DropoutMaskIsRandsDrawBelowKeep) {
  const double p = 0.25;
  const Shape shape = {2, 3, 17, 8};
  const Tensor q = input(shape, 800), k = input(shape, 801), v = input(shape, 802),
               g = input(shape, 803);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    Generator gen(7), same(7);
    gen.set_state(7, 5);
    same.set_state(7, 5);
    const Grads fused = run(
        [&](const Tensor& a, const Tensor& b, const Tensor& c) {
          return scaled_dot_product_attention(a, b, c, causal, p, std::nullopt, &gen);
        },
        q, k, v, g);
    EXPECT_EQ(gen.offset(), 6u) << "one draw per call";
    const Tensor keep = lt(rand({2, 3, 17, 17}, kF32, &same), 1.0 - p);
    const Grads naive = run(
        [&](const Tensor& a, const Tensor& b, const Tensor& c) {
          return naive_attention(a, b, c, causal, std::nullopt, keep, p);
        },
        q, k, v, g);
    expect_same(fused, naive, 1e-11, 1e-11);
  }
}

TEST(Attention, DropoutReproducibleBySeed) {
  const Shape shape = {1, 2, 33, 8};
  const Tensor q = input(shape, 810, kF32), k = input(shape, 811, kF32),
               v = input(shape, 812, kF32);
  const auto with_seed = [&](uint64_t seed) {
    Generator gen(seed);
    return scaled_dot_product_attention(q, k, v, true, 0.5, std::nullopt, &gen);
  };
  EXPECT_TRUE(equal(with_seed(3), with_seed(3)));
  EXPECT_FALSE(equal(with_seed(3), with_seed(4)));
  // The default generator: manual_seed decides the mask.
  manual_seed(11);
  const Tensor a = scaled_dot_product_attention(q, k, v, false, 0.5);
  manual_seed(11);
  EXPECT_TRUE(equal(a, scaled_dot_product_attention(q, k, v, false, 0.5)));
}

TEST(Attention, NoDropoutDrawsNothingAndFullDropoutGivesZeros) {
  const Tensor q = input({2, 4, 8}, 820), k = input({2, 5, 8}, 821), v = input({2, 5, 8}, 822);
  Generator gen(1);
  scaled_dot_product_attention(q, k, v, false, 0.0, std::nullopt, &gen);
  EXPECT_EQ(gen.offset(), 0u);
  const Tensor zero = scaled_dot_product_attention(q, k, v, false, 1.0, std::nullopt, &gen);
  EXPECT_TRUE(equal(zero, zeros({2, 4, 8}, kF64)));
}

// ---------------------------------------------------------------------------------------
// 16-bit inputs compute in f32 and round once.

TEST(Attention, HalfInputsComputeInFloat) {
  for (DType low : {kBF16, kF16}) {
    SCOPED_TRACE(dtype_name(low));
    const Shape shape = {1, 2, 70, 16};
    const Tensor q = input(shape, 830, low), k = input(shape, 831, low), v = input(shape, 832, low),
                 g = input(shape, 833, low);
    const auto f = [](const Tensor& a, const Tensor& b, const Tensor& c) {
      return scaled_dot_product_attention(a, b, c, true);
    };
    const Grads got = run(f, q, k, v, g);
    const Grads f32 = run(f, q.to(kF32), k.to(kF32), v.to(kF32), g.to(kF32));
    EXPECT_EQ(got.out.dtype(), low);
    EXPECT_EQ(got.q.dtype(), low);
    // The output is the f32 result rounded once. The gradients read the saved 16-bit output
    // (D = rowsum(dO * O)), so they agree to that rounding.
    expect_close(got.out, f32.out.to(low), 0.0, 0.0);
    const double tol = low == kBF16 ? 2e-2 : 3e-3;
    expect_close(got.q.to(kF32), f32.q, tol, tol);
    expect_close(got.k.to(kF32), f32.k, tol, tol);
    expect_close(got.v.to(kF32), f32.v, tol, tol);
  }
}

// ---------------------------------------------------------------------------------------
// Memory: the CPU path never holds an L x L matrix.

TEST(Attention, CpuPathAllocatesFarLessThanTheScoreMatrix) {
  const int64_t length = 2048, dim = 64;
  const Shape shape = {1, 1, length, dim};
  const Tensor q = input(shape, 840, kF32).requires_grad_(),
               k = input(shape, 841, kF32).requires_grad_(),
               v = input(shape, 842, kF32).requires_grad_(), g = input(shape, 843, kF32);
  const size_t score_bytes = static_cast<size_t>(length * length) * sizeof(float);
  const auto peak_of = [&](const std::function<Tensor()>& f) {
    const size_t before = cpu_memory_stats().allocated_bytes;
    reset_cpu_peak_memory_stats();
    {
      Tensor out = f();
      out.backward(g);
    }
    return cpu_memory_stats().peak_allocated_bytes - before;
  };
  // Fused: the output, the logsumexp, q/k/v's gradients and per-thread tiles.
  const size_t fused = peak_of([&] { return scaled_dot_product_attention(q, k, v, true); });
  RecordProperty("fused_peak_bytes", static_cast<int>(fused));
  EXPECT_LT(fused, score_bytes / 4)
      << "fused attention at L = " << length << " peaked at " << fused << " bytes";
  // The composition materialises the scores (and more): the statistic sees them.
  const size_t naive = peak_of([&] { return naive_attention(q, k, v, true); });
  RecordProperty("composed_peak_bytes", static_cast<int>(naive));
  EXPECT_GT(naive, score_bytes);
}

// ---------------------------------------------------------------------------------------
// Errors.

TEST(Attention, ErrorsNameTheProblem) {
  const Tensor q = input({2, 3, 5, 8}, 900), k = input({2, 3, 6, 8}, 901),
               v = input({2, 3, 6, 4}, 902);
  EXPECT_EMBER_ERROR(scaled_dot_product_attention(q, input({2, 3, 6, 7}, 903), v),
                     "scaled_dot_product_attention: query has embedding size 8 but key has 7");
  EXPECT_EMBER_ERROR(scaled_dot_product_attention(q, k, input({2, 3, 5, 4}, 904)),
                     "key has 6 positions but value has 5");
  EXPECT_EMBER_ERROR(scaled_dot_product_attention(q, input({2, 4, 6, 8}, 905), v),
                     "leading dims differ at dim 1 (query [2, 3, 5, 8], key [2, 4, 6, 8]");
  EXPECT_EMBER_ERROR(scaled_dot_product_attention(q, input({3, 6, 8}, 906), v),
                     "same number of dims");
  EXPECT_EMBER_ERROR(scaled_dot_product_attention(q, k.to(kF32), v), "key has dtype f32");
  EXPECT_EMBER_ERROR(scaled_dot_product_attention(input({8}, 907), k, v), "at least 2 dims");
  EXPECT_EMBER_ERROR(scaled_dot_product_attention(q, k, v, false, 1.5), "dropout_p must be in");
  EXPECT_EMBER_ERROR(scaled_dot_product_attention(from_vector<int64_t>({1, 2}, {1, 2}), k, v),
                     "floating query");
}

}  // namespace
}  // namespace ember
