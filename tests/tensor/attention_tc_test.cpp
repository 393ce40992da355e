// The tensor-core attention kernel (tensor/cuda/attention_tc.cuh) against the CPU op.
//   Emulated (every machine): the kernel bodies run on the CPU, one emulated CUDA block of 128
//     threads at a time, with the block barrier, warp shuffles, ldmatrix.x4 and mma.m16n8k16 as
//     the PTX ISA defines them (each lane's fragment registers decoded by the ISA's row/column
//     formulas),
//     so tiling, fragment indexing, masking, tails, online softmax and dropout are checked
//     without a GPU.
//   CUDA (skipped where no GPU is visible): the real kernels through the op, forward and the
//     three gradients, bf16 and f16, L in {1, 17, 64, 65, 127, 128, 200, 1024}, D 64 and 128,
//     causal or not, Lq != Lk, dropout; every variant at small shapes (for compute-sanitizer);
//     the simple kernel beside it (EMBER_SDPA_CUDA_KERNEL); bitwise-repeatable gradients.
// Tolerances, relative to the largest magnitude m of the expected tensor (at least 0.01):
// |got - want| <= f * (m + |want|), f = 2e-2 for bf16 and 4e-3 for f16 (the output rounds once to
// the 16-bit type, about 2^-9 resp. 2^-12 relative, and the kernel rounds P and dS to it before
// their products; a few of those roundings add up in a gradient).
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <ember/tensor/cuda/attention_tc.cuh>

#include "test_util.h"

namespace ember {
namespace {

namespace tc = detail::attention_tc;

// ---------------------------------------------------------------------------------------
// An emulated CUDA block.

class EmulatedBlock {
 public:
  static constexpr int kLanes = 32;

  // What the kernel bodies ask of a thread (the device's DeviceCtx in attention_tc.cu).
  struct Ctx {
    EmulatedBlock* block;
    int tid;
    mutable unsigned phase = 0;  // warp collectives so far: the exchange buffer to use

    int thread() const { return tid; }
    void sync() const { block->barrier_.arrive_and_wait(); }

    // cp.async: here the copy happens at once, so waiting has nothing left to do (the block
    // barrier that follows every wait in the bodies orders it as on the GPU).
    void copy16_async(uint16_t* dst, const uint16_t* src, bool valid) const {
      if (valid) {
        std::memcpy(dst, src, 16);
      } else {
        std::memset(dst, 0, 16);
      }
    }
    void copy4_async(float* dst, const float* src, bool valid) const { *dst = valid ? *src : 0.0f; }
    void commit() const {}
    void wait_newest_pending() const {}

    float shfl_xor(float v, int mask) const {
      Warp& w = block->warps_[tid / kLanes];
      const int lane = tid % kLanes, slot = static_cast<int>(phase++ % 2);
      w.f[slot][lane] = v;
      w.barrier.arrive_and_wait();
      return w.f[slot][lane ^ mask];
    }

    // ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lane l gives the address of row l % 8
    // of matrix l / 8; register i of lane l receives matrix i's elements (row l / 4, columns
    // 2 (l % 4) and 2 (l % 4) + 1), low half first, or, transposed, (rows 2 (l % 4) and
    // 2 (l % 4) + 1, column l / 4).
    void ldsm(uint32_t (&r)[4], const uint16_t* row) const { load_matrices(r, row, false); }
    void ldsm_t(uint32_t (&r)[4], const uint16_t* row) const { load_matrices(r, row, true); }

    void load_matrices(uint32_t (&r)[4], const uint16_t* row, bool transposed) const {
      Warp& w = block->warps_[tid / kLanes];
      const int lane = tid % kLanes, slot = static_cast<int>(phase++ % 2);
      w.rows[slot][lane] = row;
      w.barrier.arrive_and_wait();
      const auto at = [&](int matrix, int r_, int c) {
        uint16_t value;
        std::memcpy(&value, w.rows[slot][8 * matrix + r_] + c, sizeof(value));
        return value;
      };
      for (int i = 0; i < 4; ++i) {
        const int g = lane / 4, c = 2 * (lane % 4);
        r[i] = transposed ? tc::pack_bits(at(i, c, g), at(i, c + 1, g))
                          : tc::pack_bits(at(i, g, c), at(i, g, c + 1));
      }
    }

    // d += A B for a 16x16 A and 16x8 B spread over the warp's registers as the PTX ISA's
    // "Matrix Fragments for mma.m16n8k16 with floating point type" lays them out.
    template <typename T>
    void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) const {
      Warp& w = block->warps_[tid / kLanes];
      const int lane = tid % kLanes, slot = static_cast<int>(phase++ % 2);
      for (int r = 0; r < 4; ++r) w.a[slot][lane][r] = a[r];
      for (int r = 0; r < 2; ++r) w.b[slot][lane][r] = b[r];
      w.barrier.arrive_and_wait();
      float am[16][16], bm[16][8];
      for (int l = 0; l < kLanes; ++l) {
        const int group = l >> 2, tig = l % 4;
        for (int i = 0; i < 8; ++i) {  // a0 .. a7: two per register, low half first
          const int row = (i < 2 || (i >= 4 && i < 6)) ? group : group + 8;
          const int col = tig * 2 + (i & 1) + (i >= 4 ? 8 : 0);
          am[row][col] = element<T>(w.a[slot][l][i / 2], i % 2);
        }
        for (int i = 0; i < 4; ++i) {  // b0 .. b3
          const int row = tig * 2 + (i & 1) + (i >= 2 ? 8 : 0);
          bm[row][group] = element<T>(w.b[slot][l][i / 2], i % 2);
        }
      }
      const int group = lane >> 2, tig = lane % 4;
      for (int i = 0; i < 4; ++i) {  // c0 .. c3
        const int row = group + (i >= 2 ? 8 : 0), col = tig * 2 + (i & 1);
        float total = 0.0f;
        for (int kk = 0; kk < 16; ++kk) total += am[row][kk] * bm[kk][col];
        d[i] += total;
      }
    }
  };

  // body(ctx, block_index) for blocks 0 .. blocks - 1, one after another.
  void run(int64_t blocks, const std::function<void(const Ctx&, int64_t)>& body) {
    std::vector<std::thread> threads;
    for (int tid = 0; tid < tc::kThreads; ++tid) {
      threads.emplace_back([this, tid, blocks, &body] {
        const Ctx ctx{this, tid};
        for (int64_t b = 0; b < blocks; ++b) {
          body(ctx, b);
          ctx.sync();  // the next block reuses the shared memory
        }
      });
    }
    for (auto& t : threads) t.join();
  }

 private:
  template <typename T>
  static float element(uint32_t reg, int half) {
    return tc::to_float<T>(static_cast<uint16_t>(reg >> (16 * half)));
  }

  struct Warp {
    float f[2][kLanes];
    uint32_t a[2][kLanes][4];
    uint32_t b[2][kLanes][2];
    const uint16_t* rows[2][kLanes];
    std::barrier<> barrier{kLanes};
  };
  std::barrier<> barrier_{tc::kThreads};
  Warp warps_[tc::kThreads / kLanes];
};

// Shared memory for one emulated block (8-byte aligned; the bodies copy with memcpy).
struct SharedMemory {
  std::vector<uint64_t> words;
  explicit SharedMemory(size_t bytes) : words(bytes / 8 + 1) {}
  unsigned char* data() { return reinterpret_cast<unsigned char*>(words.data()); }
};

struct Grads {
  Tensor out, q, k, v;
};

// The emulated kernels on CPU tensors q [BH, Lq, D], k, v [BH, Lk, D], grad_out [BH, Lq, D].
template <typename T, int D, bool kDropout>
Grads emulate(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& grad_out,
              const detail::AttentionParams& a) {
  tc::Params p = tc::params_for(a, q.size(0), q.size(1), k.size(1));
  const Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous(),
               gc = grad_out.contiguous();
  Grads g{empty(q.sizes(), q.dtype()), empty(q.sizes(), q.dtype()), empty(k.sizes(), k.dtype()),
          empty(v.sizes(), v.dtype())};
  const Tensor lse = empty({p.bh, p.lq}, kF32), dsum = empty({p.bh, p.lq}, kF32);
  p.q = qc.data_ptr();
  p.k = kc.data_ptr();
  p.v = vc.data_ptr();
  p.out = g.out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.grad_out = gc.data_ptr();
  p.dsum = dsum.data_ptr<float>();
  p.grad_q = g.q.data_ptr();
  p.grad_k = g.k.data_ptr();
  p.grad_v = g.v.data_ptr();
  using Ctx = EmulatedBlock::Ctx;
  {
    SharedMemory smem(tc::forward_smem_bytes<D>());
    EmulatedBlock().run(tc::forward_blocks<D>(p), [&](const Ctx& ctx, int64_t b) {
      tc::forward_block<T, D, kDropout>(ctx, p, b, smem.data());
    });
  }
  EmulatedBlock().run(tc::row_dot_blocks(p),
                      [&](const Ctx& ctx, int64_t b) { tc::row_dot_block<T, D>(ctx, p, b); });
  {
    SharedMemory smem(tc::grad_q_smem_bytes<D>());
    EmulatedBlock().run(tc::grad_q_blocks<D>(p), [&](const Ctx& ctx, int64_t b) {
      tc::grad_q_block<T, D, kDropout>(ctx, p, b, smem.data());
    });
  }
  {
    SharedMemory smem(tc::grad_kv_smem_bytes<D>());
    EmulatedBlock().run(tc::grad_kv_blocks(p), [&](const Ctx& ctx, int64_t b) {
      tc::grad_kv_block<T, D, kDropout>(ctx, p, b, smem.data());
    });
  }
  return g;
}

template <typename T, int D>
Grads emulate(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& grad_out,
              const detail::AttentionParams& a) {
  return a.dropout_p > 0.0 ? emulate<T, D, true>(q, k, v, grad_out, a)
                           : emulate<T, D, false>(q, k, v, grad_out, a);
}

Tensor input(const Shape& shape, uint64_t seed, DType dtype) {
  Generator gen(seed);
  return uniform(shape, -1.0, 1.0, kF32, &gen).to(dtype);
}

// The op (whichever kernel its device picks) forward and backward of sum(out * grad_out).
Grads through_op(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& grad_out,
                 bool causal, double dropout = 0.0, uint64_t seed = 0) {
  Tensor ql = q.clone().requires_grad_(), kl = k.clone().requires_grad_(),
         vl = v.clone().requires_grad_();
  Generator gen(seed);
  Tensor out = scaled_dot_product_attention(ql, kl, vl, causal, dropout, std::nullopt, &gen);
  out.backward(grad_out);
  return {out.detach(), ql.grad(), kl.grad(), vl.grad()};
}

double tolerance(DType dtype) { return dtype == kBF16 ? 2e-2 : 4e-3; }

void expect_near(const Tensor& got, const Tensor& want, double f, const char* what) {
  SCOPED_TRACE(what);
  const Tensor g = got.to(kCPU).to(kF32), w = want.to(kCPU).to(kF32);
  // (a floor for gradients that are 0 up to rounding, such as q's and k's at Lk = 1)
  const double m = std::max(max(abs(w)).item<double>(), 1e-2);
  testing::expect_close(g, w, f, f * m);
}

void expect_near(const Grads& got, const Grads& want, double f) {
  expect_near(got.out, want.out, f, "output");
  expect_near(got.q, want.q, f, "grad q");
  expect_near(got.k, want.k, f, "grad k");
  expect_near(got.v, want.v, f, "grad v");
}

// ---------------------------------------------------------------------------------------
// Emulated.

struct EmulatedCase {
  int64_t bh, lq, lk;
  int d;
  bool causal;
  double dropout;
};

template <typename T>
void check_emulated(const EmulatedCase& c, uint64_t seed) {
  const DType dtype = dtype_of<T>;
  SCOPED_TRACE(::testing::Message()
               << dtype << " BH " << c.bh << " Lq " << c.lq << " Lk " << c.lk << " D " << c.d
               << (c.causal ? " causal" : "") << " dropout " << c.dropout);
  const Tensor q = input({c.bh, c.lq, c.d}, seed, dtype),
               k = input({c.bh, c.lk, c.d}, seed + 1, dtype),
               v = input({c.bh, c.lk, c.d}, seed + 2, dtype),
               g = input({c.bh, c.lq, c.d}, seed + 3, dtype);
  detail::AttentionParams a;
  a.scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  a.causal = c.causal;
  a.dropout_p = c.dropout;
  if (c.dropout > 0.0) std::tie(a.seed, a.offset) = Generator(seed).next_draw();
  const Grads got = c.d == 64 ? emulate<T, 64>(q, k, v, g, a) : emulate<T, 128>(q, k, v, g, a);
  const Grads want = through_op(q, k, v, g, c.causal, c.dropout, seed);
  expect_near(got, want, tolerance(dtype));
}

TEST(AttentionTensorCore, EmulatedKernelMatchesCpuOp) {
  const EmulatedCase cases[] = {
      {2, 1, 1, 64, false, 0.0},    {1, 17, 17, 64, true, 0.0},   {2, 65, 65, 64, false, 0.0},
      {1, 65, 65, 64, true, 0.0},   {1, 130, 130, 64, true, 0.0}, {1, 17, 17, 128, false, 0.0},
      {1, 70, 70, 128, true, 0.0},  {1, 70, 33, 64, true, 0.0},   {1, 20, 100, 64, true, 0.0},
      {1, 33, 70, 128, false, 0.0}, {1, 200, 200, 64, true, 0.0},
  };
  uint64_t seed = 100;
  for (const EmulatedCase& c : cases) {
    check_emulated<BFloat16>(c, seed);
    seed += 4;
  }
  check_emulated<Half>({1, 65, 65, 64, true, 0.0}, seed);
  check_emulated<Half>({1, 40, 40, 128, false, 0.0}, seed + 4);
}

TEST(AttentionTensorCore, EmulatedKernelDropoutMatchesCpuOp) {
  check_emulated<BFloat16>({2, 40, 40, 64, true, 0.3}, 300);
  check_emulated<Half>({1, 70, 50, 128, false, 0.2}, 304);
}

// ---------------------------------------------------------------------------------------
// CUDA.

// Sets EMBER_SDPA_CUDA_KERNEL for a scope (unset: null) and restores it.
class KernelChoice {
 public:
  explicit KernelChoice(const char* value) {
    if (const char* old = std::getenv(kName)) saved_ = old;
    if (value != nullptr) {
      setenv(kName, value, 1);
    } else {
      unsetenv(kName);
    }
  }
  ~KernelChoice() {
    if (saved_) {
      setenv(kName, saved_->c_str(), 1);
    } else {
      unsetenv(kName);
    }
  }
  KernelChoice(const KernelChoice&) = delete;
  KernelChoice& operator=(const KernelChoice&) = delete;

 private:
  static constexpr const char* kName = "EMBER_SDPA_CUDA_KERNEL";
  std::optional<std::string> saved_;
};

Grads on_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, bool causal,
              double dropout = 0.0, uint64_t seed = 0) {
  const Device dev = cuda_device();
  return through_op(q.to(dev), k.to(dev), v.to(dev), g.to(dev), causal, dropout, seed);
}

TEST(AttentionTensorCore, CudaMatchesCpuOp) {
  EMBER_REQUIRE_CUDA();
  const KernelChoice choice("tensor_core");
  uint64_t seed = 1000;
  for (DType dtype : {kBF16, kF16}) {
    for (int64_t length : {1, 17, 64, 65, 127, 128, 200, 1024}) {
      for (int64_t dim : {64, 128}) {
        for (bool causal : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << dtype << " L " << length << " D " << dim << (causal ? " causal" : ""));
          const Shape shape = {2, 3, length, dim};
          const Tensor q = input(shape, seed, dtype), k = input(shape, seed + 1, dtype),
                       v = input(shape, seed + 2, dtype), g = input(shape, seed + 3, dtype);
          seed += 4;
          expect_near(on_cuda(q, k, v, g, causal), through_op(q, k, v, g, causal),
                      tolerance(dtype));
        }
      }
    }
  }
}

TEST(AttentionTensorCore, CudaOtherLengthsAndDropoutMatchCpuOp) {
  EMBER_REQUIRE_CUDA();
  const KernelChoice choice("tensor_core");
  struct Case {
    int64_t lq, lk, dim;
    bool causal;
    double dropout;
  };
  const Case cases[] = {
      {70, 33, 64, true, 0.0},     {33, 70, 128, false, 0.0}, {20, 300, 64, true, 0.0},
      {300, 20, 128, true, 0.0},   {200, 200, 64, true, 0.1}, {129, 129, 128, false, 0.3},
      {1024, 1024, 64, true, 0.1},
  };
  uint64_t seed = 2000;
  for (DType dtype : {kBF16, kF16}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message()
                   << dtype << " Lq " << c.lq << " Lk " << c.lk << " D " << c.dim
                   << (c.causal ? " causal" : "") << " dropout " << c.dropout);
      const Tensor q = input({2, 2, c.lq, c.dim}, seed, dtype),
                   k = input({2, 2, c.lk, c.dim}, seed + 1, dtype),
                   v = input({2, 2, c.lk, c.dim}, seed + 2, dtype),
                   g = input({2, 2, c.lq, c.dim}, seed + 3, dtype);
      seed += 4;
      expect_near(on_cuda(q, k, v, g, c.causal, c.dropout, seed),
                  through_op(q, k, v, g, c.causal, c.dropout, seed), tolerance(dtype));
    }
  }
}

// Every kernel variant (D 64 and 128, causal or not, dropout or not) at small shapes with
// tails, quick enough to run under compute-sanitizer (bench/attention_gpu_check.sh).
TEST(AttentionTensorCore, CudaSmallShapesEveryVariant) {
  EMBER_REQUIRE_CUDA();
  const KernelChoice choice("tensor_core");
  uint64_t seed = 2500;
  for (int64_t dim : {64, 128}) {
    for (bool causal : {false, true}) {
      for (double dropout : {0.0, 0.2}) {
        SCOPED_TRACE(::testing::Message() << "D " << dim << (causal ? " causal" : "")
                                          << " dropout " << dropout);
        const Tensor q = input({1, 2, 130, dim}, seed, kBF16),
                     k = input({1, 2, 97, dim}, seed + 1, kBF16),
                     v = input({1, 2, 97, dim}, seed + 2, kBF16),
                     g = input({1, 2, 130, dim}, seed + 3, kBF16);
        seed += 4;
        expect_near(on_cuda(q, k, v, g, causal, dropout, seed),
                    through_op(q, k, v, g, causal, dropout, seed), tolerance(kBF16));
      }
    }
  }
}

TEST(AttentionTensorCore, SimpleAndTensorCoreKernelsAgreeAndBothRun) {
  EMBER_REQUIRE_CUDA();
  const Shape shape = {2, 3, 200, 64};
  const Tensor q = input(shape, 3000, kBF16), k = input(shape, 3001, kBF16),
               v = input(shape, 3002, kBF16), g = input(shape, 3003, kBF16);
  std::optional<Grads> simple, tensor_core, by_default;
  {
    const KernelChoice choice("simple");
    simple = on_cuda(q, k, v, g, true);
  }
  {
    const KernelChoice choice("tensor_core");
    tensor_core = on_cuda(q, k, v, g, true);
  }
  {
    const KernelChoice choice(nullptr);
    by_default = on_cuda(q, k, v, g, true);
  }
  expect_near(*tensor_core, *simple, tolerance(kBF16));
  // The simple kernel keeps the weights in f32, the tensor-core one rounds them to bf16:
  // different bits show that the variable switched kernels; unset picks the tensor cores.
  EXPECT_FALSE(equal(tensor_core->q, simple->q));
  EXPECT_TRUE(equal(by_default->q, tensor_core->q));
  {
    const KernelChoice choice("fastest");
    EXPECT_EMBER_ERROR(on_cuda(q, k, v, g, true), "EMBER_SDPA_CUDA_KERNEL must be simple or");
  }
}

TEST(AttentionTensorCore, CudaGradientsRepeatBitForBit) {
  EMBER_REQUIRE_CUDA();
  const KernelChoice choice("tensor_core");
  const Shape shape = {4, 6, 256, 64};
  const Tensor q = input(shape, 4000, kBF16), k = input(shape, 4001, kBF16),
               v = input(shape, 4002, kBF16), g = input(shape, 4003, kBF16);
  const Grads a = on_cuda(q, k, v, g, true), b = on_cuda(q, k, v, g, true);
  EXPECT_TRUE(equal(a.out, b.out));
  EXPECT_TRUE(equal(a.q, b.q));
  EXPECT_TRUE(equal(a.k, b.k));
  EXPECT_TRUE(equal(a.v, b.v));
}

}  // namespace
}  // namespace ember
