// tensor/cuda/attention.cu (the simple attention kernel: a warp per query row, shared-memory
// rows, the logsumexp saved for the backward) emulated on the CPU
// (tensor/cuda/emulated/emulate.h) against the CPU kernels: forward and backward, E != Ev,
// Lq != Lk, causal, dropout, more rows than the emulated grid covers, every floating dtype;
// planted bugs fail.
#include <ember/tensor/cuda/attention.cu>

#include <tuple>

#include "emulated_test_util.h"

namespace ember::testing {
namespace {

const detail::KernelTable& kernels() {
  return emulated_table<detail::emulated::register_cuda_attention_kernels>();
}

struct Case {
  int64_t bh, lq, lk, e, ev;
  bool causal;
  double dropout;
};

KernelRun attention_run(const Case& c, DType dtype, uint64_t seed) {
  const Tensor q = random_input({c.bh, c.lq, c.e}, dtype, seed),
               k = random_input({c.bh, c.lk, c.e}, dtype, seed + 1),
               v = random_input({c.bh, c.lk, c.ev}, dtype, seed + 2),
               g = random_input({c.bh, c.lq, c.ev}, dtype, seed + 3);
  detail::AttentionParams a;
  a.scale = 1.0 / std::sqrt(static_cast<double>(c.e));
  a.causal = c.causal;
  a.dropout_p = c.dropout;
  if (c.dropout > 0.0) std::tie(a.seed, a.offset) = Generator(seed).next_draw();
  return [=](const detail::KernelTable& t) {
    const DType lse_type = dtype == kF64 ? kF64 : kF32;
    const Tensor out = poisoned({c.bh, c.lq, c.ev}, dtype), lse = poisoned({c.bh, c.lq}, lse_type);
    t.attention_forward(out, lse, q, k, v, a);
    const Tensor gq = poisoned(q.sizes(), dtype), gk = poisoned(k.sizes(), dtype),
                 gv = poisoned(v.sizes(), dtype);
    t.attention_backward(gq, gk, gv, g, q, k, v, out, lse, a);
    return Outputs{out, lse, gq, gk, gv};
  };
}

TEST(EmulatedAttention, ForwardAndBackwardMatchCpu) {
  const Case cases[] = {{1, 1, 1, 4, 4, false, 0.0},     {2, 17, 9, 8, 12, true, 0.0},
                        {1, 40, 40, 16, 16, false, 0.0}, {3, 30, 33, 8, 8, true, 0.0},
                        {1, 20, 20, 8, 8, false, 0.3},   {2, 9, 25, 8, 4, true, 0.2}};
  uint64_t seed = 10;
  for (DType dtype : {kF32, kF64, kBF16, kF16}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message()
                   << dtype << " BH " << c.bh << " Lq " << c.lq << " Lk " << c.lk << " E " << c.e
                   << " Ev " << c.ev << (c.causal ? " causal" : "") << " dropout " << c.dropout);
      // Dot products and sums in another order, then rounded: a few roundings more.
      expect_parity(kernels(), attention_run(c, dtype, seed), 4 * tolerance(dtype),
                    4 * tolerance(dtype));
      seed += 4;
    }
  }
}

TEST(EmulatedAttention, PlantedBugsFail) {
  const KernelRun run = attention_run({2, 30, 30, 8, 8, true, 0.0}, kF32, 50);
  expect_planted_bug_fails(kernels(), run, cuda_emu::Bug::kWrongShuffleMask, 0, 1e-4, 1e-4);
  expect_planted_bug_fails(kernels(), run, cuda_emu::Bug::kLostTailThread, 0, 1e-4, 1e-4);
}

}  // namespace
}  // namespace ember::testing
