// tensor/cuda/attention_tc.cu (the tensor-core attention: cp.async tiles, ldmatrix, mma.sync,
// online softmax, dropout), emulated on the CPU (tensor/cuda/emulated/emulate.h) through its
// own host launchers, against the CPU op: forward and the three gradients, bf16 and f16, D 64
// and 128, tails of the 64-row tiles, causal or not, Lq != Lk, dropout (tolerances:
// attention_tc_util.h). Planted bugs (a missing cp.async wait, a missing barrier, a wrong
// shuffle mask) fail.
#include <ember/tensor/cuda/attention_tc.cu>

#include <algorithm>
#include <tuple>

#include "../attention_tc_util.h"
#include "emulated_test_util.h"

namespace ember::testing::attention_tc {
namespace {

// The emulated kernels on q [BH, Lq, D], k, v [BH, Lk, D], grad_out [BH, Lq, D].
Grads emulate(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& grad_out,
              const detail::AttentionParams& a) {
  const int64_t bh = q.size(0), lq = q.size(1);
  Grads g{poisoned(q.sizes(), q.dtype()), poisoned(q.sizes(), q.dtype()),
          poisoned(k.sizes(), k.dtype()), poisoned(v.sizes(), v.dtype())};
  const Tensor lse = poisoned({bh, lq}, kF32);
  detail::emulated::attention_tc_forward(g.out, lse, q, k, v, a);
  detail::emulated::attention_tc_backward(g.q, g.k, g.v, grad_out, q, k, v, g.out, lse, a);
  return g;
}

std::optional<std::string> mismatch(const Grads& got, const Grads& want, double f) {
  const std::pair<const Tensor*, const Tensor*> pairs[] = {
      {&got.out, &want.out}, {&got.q, &want.q}, {&got.k, &want.k}, {&got.v, &want.v}};
  const char* names[] = {"output", "grad q", "grad k", "grad v"};
  for (int i = 0; i < 4; ++i) {
    const Tensor g = pairs[i].first->to(kF32), w = pairs[i].second->to(kF32);
    if (auto bad = testing::mismatch(g, w, f, f * magnitude(w)))
      return std::string(names[i]) + ": " + *bad;
  }
  return std::nullopt;
}

struct Case {
  int64_t bh, lq, lk;
  int d;
  bool causal;
  double dropout;
};

struct Inputs {
  Tensor q, k, v, g;
  detail::AttentionParams a;
};

Inputs inputs(const Case& c, DType dtype, uint64_t seed) {
  Inputs in{input({c.bh, c.lq, c.d}, seed, dtype),
            input({c.bh, c.lk, c.d}, seed + 1, dtype),
            input({c.bh, c.lk, c.d}, seed + 2, dtype),
            input({c.bh, c.lq, c.d}, seed + 3, dtype),
            {}};
  in.a.scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  in.a.causal = c.causal;
  in.a.dropout_p = c.dropout;
  if (c.dropout > 0.0) std::tie(in.a.seed, in.a.offset) = Generator(seed).next_draw();
  return in;
}

void check(const Case& c, DType dtype, uint64_t seed) {
  SCOPED_TRACE(::testing::Message()
               << dtype << " BH " << c.bh << " Lq " << c.lq << " Lk " << c.lk << " D " << c.d
               << (c.causal ? " causal" : "") << " dropout " << c.dropout);
  const Inputs in = inputs(c, dtype, seed);
  const Grads want = through_op(in.q, in.k, in.v, in.g, c.causal, c.dropout, seed);
  for (const Outputs& got : in_both_orders([&] {
         const Grads g = emulate(in.q, in.k, in.v, in.g, in.a);
         return Outputs{g.out, g.q, g.k, g.v};
       })) {
    const auto bad = mismatch({got[0], got[1], got[2], got[3]}, want, tolerance(dtype));
    EXPECT_FALSE(bad.has_value()) << *bad;
  }
}

TEST(EmulatedAttentionTensorCore, MatchesCpuOp) {
  const Case cases[] = {
      {2, 1, 1, 64, false, 0.0},    {1, 17, 17, 64, true, 0.0},   {1, 65, 65, 64, true, 0.0},
      {1, 130, 130, 64, true, 0.0}, {1, 17, 17, 128, false, 0.0}, {1, 70, 33, 128, true, 0.0},
      {1, 20, 100, 64, true, 0.0},
  };
  uint64_t seed = 100;
  for (const Case& c : cases) {
    check(c, kBF16, seed);
    seed += 4;
  }
  check({1, 65, 65, 64, true, 0.0}, kF16, seed);
  check({1, 40, 40, 128, false, 0.0}, kF16, seed + 4);
}

TEST(EmulatedAttentionTensorCore, DropoutMatchesCpuOp) {
  check({2, 40, 40, 64, true, 0.3}, kBF16, 300);
  check({1, 70, 50, 128, false, 0.2}, kF16, 304);
}

TEST(EmulatedAttentionTensorCore, PlantedBugsFail) {
  const Case c{1, 70, 70, 64, true, 0.0};
  const Inputs in = inputs(c, kBF16, 400);
  const Grads want = through_op(in.q, in.k, in.v, in.g, c.causal, 0.0, 400);
  for (const auto bug : {cuda_emu::Bug::kMissingCpAsyncWait, cuda_emu::Bug::kMissingBarrier,
                         cuda_emu::Bug::kWrongShuffleMask}) {
    SCOPED_TRACE(::testing::Message() << "bug " << static_cast<int>(bug));
    const cuda_emu::PlantedBug planted(bug, 0);
    bool failed = false;
    try {
      for (const Outputs& got : in_both_orders([&] {
             const Grads g = emulate(in.q, in.k, in.v, in.g, in.a);
             return Outputs{g.out, g.q, g.k, g.v};
           })) {
        failed = failed ||
                 mismatch({got[0], got[1], got[2], got[3]}, want, tolerance(kBF16)).has_value();
      }
    } catch (const Error&) {
      failed = true;
    }
    EXPECT_GT(planted.hits(), 0);
    EXPECT_TRUE(failed);
  }
}

}  // namespace
}  // namespace ember::testing::attention_tc
