// CPU conv2d. f32 (and f16/bf16 through f32) runs on oneDNN when the build has it: its
// blocked-layout JIT kernels measure 2-10x faster than im2col on the ResNet shapes (see
// bench/conv_bench). bf16 runs on oneDNN's bf16 kernels (f32 accumulation, one rounding of
// each output) where the CPU has bf16 instructions (AVX512-BF16 or AMX); elsewhere, and for
// f16, through f32 copies, which rounds the same f32 sums once. Otherwise, and for f64: im2col over
// a chunk of the batch, one OpenBLAS GEMM per group for the whole chunk (so OpenBLAS's threads see
// large products), col2im for grad_input. Channels-last convolutions run on oneDNN's nhwc
// kernels in place; im2col (f64, builds without oneDNN) converts them to NCHW and back.

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "../detail/dispatch.h"
#include "../ops.h"
#include "blas.h"
#include "cpu_kernels.h"
#include "onednn.h"

namespace ember::detail {
namespace {

// Geometry of one convolution, in elements.
struct ConvShape {
  int64_t n, c, h, w;  // input
  int64_t o, kh, kw;   // weight [o, c / groups, kh, kw]
  int64_t ho, wo;      // output
  int64_t sh, sw, ph, pw, dh, dw, groups;
  int64_t cg() const { return c / groups; }
  int64_t og() const { return o / groups; }
  int64_t kk() const { return kh * kw; }
  int64_t rows() const { return c * kh * kw; }  // rows of the column matrix
  int64_t plane_in() const { return h * w; }
  int64_t plane_out() const { return ho * wo; }
};

ConvShape conv_shape(const Tensor& input, const Tensor& weight, int64_t ho, int64_t wo,
                     const Conv2dParams& p) {
  return {input.size(0),
          input.size(1),
          input.size(2),
          input.size(3),
          weight.size(0),
          weight.size(2),
          weight.size(3),
          ho,
          wo,
          p.stride[0],
          p.stride[1],
          p.padding[0],
          p.padding[1],
          p.dilation[0],
          p.dilation[1],
          p.groups};
}

// Samples per chunk: the column buffer of a chunk stays near kColTarget elements.
constexpr int64_t kColTarget = int64_t{1} << 22;
int64_t chunk_size(const ConvShape& s) {
  const int64_t per_sample = std::max<int64_t>(1, s.rows() * s.plane_out());
  return std::clamp<int64_t>(kColTarget / per_sample, 1, s.n);
}

// True when the column matrix of a sample is its input plane itself (1x1, stride 1, no pad).
bool is_pointwise(const ConvShape& s) {
  return s.kh == 1 && s.kw == 1 && s.sh == 1 && s.sw == 1 && s.ph == 0 && s.pw == 0;
}

// col [rows, nc * P] (P = ho * wo) from input samples [n0, n0 + nc).
template <typename T>
void im2col(T* col, const T* input, const ConvShape& s, int64_t n0, int64_t nc) {
  const int64_t P = s.plane_out(), ld = nc * P;
  const int64_t rows = s.rows();
#pragma omp parallel for collapse(2) schedule(static) if (rows * ld >= kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nc; ++b) {
      const int64_t c = r / s.kk(), i = (r / s.kw) % s.kh, j = r % s.kw;
      const T* plane = input + ((n0 + b) * s.c + c) * s.plane_in();
      T* dst = col + r * ld + b * P;
      // Output columns [ow_lo, ow_hi) read inside the input row; the rest are padding.
      const int64_t off_w = j * s.dw - s.pw;
      int64_t ow_lo = off_w >= 0 ? 0 : (-off_w + s.sw - 1) / s.sw;
      int64_t ow_hi = s.w - off_w <= 0 ? 0 : (s.w - off_w + s.sw - 1) / s.sw;
      ow_lo = std::min(ow_lo, s.wo);
      ow_hi = std::clamp(ow_hi, ow_lo, s.wo);
      for (int64_t oh = 0; oh < s.ho; ++oh) {
        T* out = dst + oh * s.wo;
        const int64_t ih = oh * s.sh - s.ph + i * s.dh;
        if (ih < 0 || ih >= s.h) {
          std::fill(out, out + s.wo, T(0));
          continue;
        }
        const T* row = plane + ih * s.w + off_w;
        std::fill(out, out + ow_lo, T(0));
        if (s.sw == 1) {
          std::memcpy(out + ow_lo, row + ow_lo, static_cast<size_t>(ow_hi - ow_lo) * sizeof(T));
        } else {
          for (int64_t ow = ow_lo; ow < ow_hi; ++ow) out[ow] = row[ow * s.sw];
        }
        std::fill(out + ow_hi, out + s.wo, T(0));
      }
    }
  }
}

// grad_input samples [n0, n0 + nc) = col2im(col [rows, nc * P]); each (sample, channel) plane
// is written by one thread, from the kh * kw rows of its channel.
template <typename T>
void col2im(T* grad_input, const T* col, const ConvShape& s, int64_t n0, int64_t nc) {
  const int64_t P = s.plane_out(), ld = nc * P;
#pragma omp parallel for collapse(2) schedule(static) if (s.rows() * ld >= kParallelGrain)
  for (int64_t b = 0; b < nc; ++b) {
    for (int64_t c = 0; c < s.c; ++c) {
      T* plane = grad_input + ((n0 + b) * s.c + c) * s.plane_in();
      std::fill(plane, plane + s.plane_in(), T(0));
      for (int64_t i = 0; i < s.kh; ++i) {
        for (int64_t j = 0; j < s.kw; ++j) {
          const T* src = col + ((c * s.kh + i) * s.kw + j) * ld + b * P;
          const int64_t off_w = j * s.dw - s.pw;
          int64_t ow_lo = off_w >= 0 ? 0 : (-off_w + s.sw - 1) / s.sw;
          int64_t ow_hi = s.w - off_w <= 0 ? 0 : (s.w - off_w + s.sw - 1) / s.sw;
          ow_lo = std::min(ow_lo, s.wo);
          ow_hi = std::clamp(ow_hi, ow_lo, s.wo);
          for (int64_t oh = 0; oh < s.ho; ++oh) {
            const int64_t ih = oh * s.sh - s.ph + i * s.dh;
            if (ih < 0 || ih >= s.h) continue;
            T* row = plane + ih * s.w + off_w;
            const T* in = src + oh * s.wo;
            if (s.sw == 1) {
              for (int64_t ow = ow_lo; ow < ow_hi; ++ow) row[ow] += in[ow];
            } else {
              for (int64_t ow = ow_lo; ow < ow_hi; ++ow) row[ow * s.sw] += in[ow];
            }
          }
        }
      }
    }
  }
}

// Chunk samples [n0, n0 + nc) of x [N, C, P] as [C, nc * P] (channel-major), or back.
template <typename T>
void to_channel_major(T* dst, const T* x, int64_t C, int64_t P, int64_t n0, int64_t nc) {
#pragma omp parallel for collapse(2) schedule(static) if (C * nc * P >= kParallelGrain)
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t b = 0; b < nc; ++b) {
      std::memcpy(dst + (c * nc + b) * P, x + ((n0 + b) * C + c) * P,
                  static_cast<size_t>(P) * sizeof(T));
    }
  }
}

template <typename T>
void conv_forward_typed(const Tensor& out, const Tensor& input, const Tensor& weight,
                        const Tensor& bias, const ConvShape& s) {
  const T* x = input.data_ptr<T>();
  const T* wt = weight.data_ptr<T>();
  const T* bs = bias.defined() ? bias.data_ptr<T>() : nullptr;
  T* y = out.data_ptr<T>();
  const int64_t P = s.plane_out(), K = s.cg() * s.kk(), nchunk = chunk_size(s);
  const bool pointwise = is_pointwise(s);
  std::vector<T> col(static_cast<size_t>(pointwise ? s.c * nchunk * P : s.rows() * nchunk * P));
  std::vector<T> res(static_cast<size_t>(s.o * nchunk * P));
  for (int64_t n0 = 0; n0 < s.n; n0 += nchunk) {
    const int64_t nc = std::min(nchunk, s.n - n0), ld = nc * P;
    if (pointwise) {
      to_channel_major(col.data(), x, s.c, P, n0, nc);
    } else {
      im2col(col.data(), x, s, n0, nc);
    }
    for (int64_t g = 0; g < s.groups; ++g) {
      blas_gemm<T>(false, false, s.og(), ld, K, T(1), wt + g * s.og() * K, K,
                   col.data() + g * K * ld, ld, T(0), res.data() + g * s.og() * ld, ld);
    }
    // res [O, nc * P] -> y [nc, O, P] with the bias.
#pragma omp parallel for collapse(2) schedule(static) if (s.o * ld >= kParallelGrain)
    for (int64_t b = 0; b < nc; ++b) {
      for (int64_t o = 0; o < s.o; ++o) {
        const T* src = res.data() + (o * nc + b) * P;
        T* dst = y + ((n0 + b) * s.o + o) * P;
        const T add = bs ? bs[o] : T(0);
        for (int64_t p = 0; p < P; ++p) dst[p] = src[p] + add;
      }
    }
  }
}

template <typename T>
void conv_backward_typed(const Tensor& grad_input, const Tensor& grad_weight,
                         const Tensor& grad_bias, const Tensor& grad_out, const Tensor& input,
                         const Tensor& weight, const ConvShape& s) {
  const T* gy = grad_out.data_ptr<T>();
  const int64_t P = s.plane_out(), K = s.cg() * s.kk();
  if (grad_bias.defined()) {
    T* gb = grad_bias.data_ptr<T>();
#pragma omp parallel for schedule(static) if (s.n * s.o * P >= kParallelGrain)
    for (int64_t o = 0; o < s.o; ++o) {
      acc_t<T> total = 0;
      for (int64_t b = 0; b < s.n; ++b) {
        const T* src = gy + (b * s.o + o) * P;
        for (int64_t p = 0; p < P; ++p) total += src[p];
      }
      gb[o] = static_cast<T>(total);
    }
  }
  if (!grad_input.defined() && !grad_weight.defined()) return;
  const T* x = input.data_ptr<T>();
  const T* wt = weight.data_ptr<T>();
  T* gw = grad_weight.defined() ? grad_weight.data_ptr<T>() : nullptr;
  T* gx = grad_input.defined() ? grad_input.data_ptr<T>() : nullptr;
  const int64_t nchunk = chunk_size(s);
  const bool pointwise = is_pointwise(s);
  std::vector<T> col(static_cast<size_t>(s.rows() * nchunk * P));
  std::vector<T> gy_cm(static_cast<size_t>(s.o * nchunk * P));
  for (int64_t n0 = 0; n0 < s.n; n0 += nchunk) {
    const int64_t nc = std::min(nchunk, s.n - n0), ld = nc * P;
    to_channel_major(gy_cm.data(), gy, s.o, P, n0, nc);
    if (gw) {
      if (pointwise) {
        to_channel_major(col.data(), x, s.c, P, n0, nc);
      } else {
        im2col(col.data(), x, s, n0, nc);
      }
      // grad_weight_g [Og, K] += gy_g [Og, ld] @ col_g^T [ld, K]
      for (int64_t g = 0; g < s.groups; ++g) {
        blas_gemm<T>(false, true, s.og(), K, ld, T(1), gy_cm.data() + g * s.og() * ld, ld,
                     col.data() + g * K * ld, ld, n0 == 0 ? T(0) : T(1), gw + g * s.og() * K, K);
      }
    }
    if (gx) {
      // col_g [K, ld] = W_g^T [K, Og] @ gy_g [Og, ld], then scattered back to the input.
      for (int64_t g = 0; g < s.groups; ++g) {
        blas_gemm<T>(true, false, K, ld, s.og(), T(1), wt + g * s.og() * K, K,
                     gy_cm.data() + g * s.og() * ld, ld, T(0), col.data() + g * K * ld, ld);
      }
      if (pointwise) {
#pragma omp parallel for collapse(2) schedule(static) if (s.c * ld >= kParallelGrain)
        for (int64_t b = 0; b < nc; ++b) {
          for (int64_t c = 0; c < s.c; ++c) {
            std::memcpy(gx + ((n0 + b) * s.c + c) * P, col.data() + (c * nc + b) * P,
                        static_cast<size_t>(P) * sizeof(T));
          }
        }
      } else {
        col2im(gx, col.data(), s, n0, nc);
      }
    }
  }
}

#if EMBER_WITH_DNNL
// oneDNN primitives for one convolution geometry, created once and cached.
namespace onednn {

using dnnl::memory;
using ::ember::detail::onednn::engine;
using ::ember::detail::onednn::native_bf16;
using Tag = memory::format_tag;

struct Primitives {
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_data::primitive_desc data_pd;
  dnnl::convolution_backward_data data;
  dnnl::convolution_backward_weights::primitive_desc weights_pd;
  dnnl::convolution_backward_weights weights;
};

memory::dims weight_dims(const ConvShape& s) {
  if (s.groups == 1) return {s.o, s.c, s.kh, s.kw};
  return {s.groups, s.og(), s.cg(), s.kh, s.kw};
}

using DataType = memory::data_type;

// f32, or bf16 where the CPU computes it natively (tensors of other dtypes go through f32).
DataType data_type(DType dtype) { return dtype == kBF16 ? DataType::bf16 : DataType::f32; }

// A tensor as oneDNN memory of its own strides (NCHW or NHWC; weights OIHW or OHWI, split
// per group when grouped).
memory::desc user_desc(const Tensor& t, DataType dt, const memory::dims& dims) {
  memory::dims strides(t.strides().begin(), t.strides().end());
  if (dims.size() == 5) strides.insert(strides.begin(), t.stride(0) * dims[1]);
  return {dims, dt, strides};
}
memory::desc user_src(const ConvShape& s, DataType dt, const Tensor& t) {
  return user_desc(t, dt, {s.n, s.c, s.h, s.w});
}
memory::desc user_dst(const ConvShape& s, DataType dt, const Tensor& t) {
  return user_desc(t, dt, {s.n, s.o, s.ho, s.wo});
}
memory::desc user_weights(const ConvShape& s, DataType dt, const Tensor& t) {
  return user_desc(t, dt, weight_dims(s));
}
memory::desc user_bias(const ConvShape& s, DataType dt) { return {{s.o}, dt, Tag::x}; }

// NOTE: channels-last convolutions fix src/dst (and their gradients) to nhwc, so oneDNN
// runs its nhwc kernels on the tensors' own memory rather than reordering them to a blocked
// layout and back; weights stay free (`any`), their reorder being small.
std::unique_ptr<Primitives> create(const ConvShape& s, bool bias, DataType dt, bool cl) {
  const auto any = [dt](const memory::dims& d) { return memory::desc(d, dt, Tag::any); };
  const auto act = [dt, cl](const memory::dims& d) {
    return memory::desc(d, dt, cl ? Tag::nhwc : Tag::any);
  };
  const memory::desc src = act({s.n, s.c, s.h, s.w}), dst = act({s.n, s.o, s.ho, s.wo});
  const memory::desc wei = any(weight_dims(s));
  const memory::desc b = bias ? any({s.o}) : memory::desc();
  const memory::dims strides{s.sh, s.sw}, dilation{s.dh - 1, s.dw - 1}, pad_l{s.ph, s.pw};
  // Right padding as the output size implies (floor division may leave input unused).
  const memory::dims pad_r{(s.ho - 1) * s.sh + (s.kh - 1) * s.dh + 1 - s.h - s.ph,
                           (s.wo - 1) * s.sw + (s.kw - 1) * s.dw + 1 - s.w - s.pw};
  const auto algo = dnnl::algorithm::convolution_direct;
  // Scratchpads come from ember's allocator too (see scratch()).
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  auto p = std::make_unique<Primitives>();
  p->fwd_pd = dnnl::convolution_forward::primitive_desc(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, src, wei, b, dst,
                                      strides, dilation, pad_l, pad_r),
      attr, engine());
  p->fwd = dnnl::convolution_forward(p->fwd_pd);
  p->data_pd = dnnl::convolution_backward_data::primitive_desc(
      dnnl::convolution_backward_data::desc(algo, src, wei, dst, strides, dilation, pad_l, pad_r),
      attr, engine(), p->fwd_pd);
  p->data = dnnl::convolution_backward_data(p->data_pd);
  p->weights_pd = dnnl::convolution_backward_weights::primitive_desc(
      dnnl::convolution_backward_weights::desc(algo, src, wei, b, dst, strides, dilation, pad_l,
                                               pad_r),
      attr, engine(), p->fwd_pd);
  p->weights = dnnl::convolution_backward_weights(p->weights_pd);
  return p;
}

// EMBER_CPU_CONV=im2col in the environment keeps f32 on im2col (for benchmarks and checks).
bool disabled() {
  static const bool off = [] {
    const char* v = std::getenv("EMBER_CPU_CONV");
    return v != nullptr && std::strcmp(v, "im2col") == 0;
  }();
  return off;
}

// The cached primitives of a geometry; null when oneDNN cannot run it (then im2col does).
const Primitives* lookup(const ConvShape& s, bool bias, DataType dt, bool cl) {
  if (disabled()) return nullptr;
  using Key =
      std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                 int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, DataType, bool>;
  static std::mutex mutex;
  static std::map<Key, std::unique_ptr<Primitives>> cache;
  const Key key{s.n,  s.c,  s.h,  s.w,  s.o,  s.kh,     s.kw, s.sh, s.sw,
                s.ph, s.pw, s.dh, s.dw, s.ho, s.groups, bias, dt,   cl};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) {
    std::unique_ptr<Primitives> p;
    try {
      p = create(s, bias, dt, cl);
    } catch (const dnnl::error&) {
      p = nullptr;  // unsupported geometry: fall back
    }
    it = cache.emplace(key, std::move(p)).first;
  }
  return it->second.get();
}

// Memory in layout `desc` from ember's CPU allocator (whose freed blocks are reused, so no
// fresh pages are faulted in every step); `keep` holds it until the primitives have run.
memory scratch(const memory::desc& desc, std::vector<Tensor>& keep) {
  keep.push_back(empty({static_cast<int64_t>(desc.get_size())}, kU8));
  return memory(desc, engine(), keep.back().data_ptr());
}

// `user` as the primitive wants `want`: itself, or a reordered copy.
memory as_layout(const memory& user, const memory::desc& want, dnnl::stream& st,
                 std::vector<Tensor>& keep) {
  if (user.get_desc() == want) return user;
  memory out = scratch(want, keep);
  dnnl::reorder(user, out).execute(st, const_cast<memory&>(user), out);
  return out;
}

// Runs `prim` writing `result` (a user-layout memory) through a `want`-layout buffer if needed.
template <typename Run>
void into_user(const memory& result, const memory::desc& want, dnnl::stream& st,
               std::vector<Tensor>& keep, Run&& run) {
  if (result.get_desc() == want) {
    run(result);
    return;
  }
  memory tmp = scratch(want, keep);
  run(tmp);
  dnnl::reorder(tmp, result).execute(st, tmp, const_cast<memory&>(result));
}

memory wrap(const memory::desc& desc, const Tensor& t) {
  return memory(desc, engine(), t.data_ptr());
}

// Tensors of one dtype, f32 or bf16 (the caller checks native_bf16() for bf16).
bool forward(const Tensor& out, const Tensor& input, const Tensor& weight, const Tensor& bias,
             const ConvShape& s, bool cl) {
  const DataType dt = data_type(input.dtype());
  const Primitives* p = lookup(s, bias.defined(), dt, cl);
  if (p == nullptr) return false;
  dnnl::stream st(engine());
  std::vector<Tensor> keep;
  const memory src = as_layout(wrap(user_src(s, dt, input), input), p->fwd_pd.src_desc(), st, keep);
  const memory wei =
      as_layout(wrap(user_weights(s, dt, weight), weight), p->fwd_pd.weights_desc(), st, keep);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}};
  if (bias.defined()) args.emplace(DNNL_ARG_BIAS, wrap(user_bias(s, dt), bias));
  args.emplace(DNNL_ARG_SCRATCHPAD, scratch(p->fwd_pd.scratchpad_desc(), keep));
  into_user(wrap(user_dst(s, dt, out), out), p->fwd_pd.dst_desc(), st, keep,
            [&](const memory& dst) {
              args.emplace(DNNL_ARG_DST, dst);
              p->fwd.execute(st, args);
            });
  st.wait();
  return true;
}

bool backward(const Tensor& grad_input, const Tensor& grad_weight, const Tensor& grad_bias,
              const Tensor& grad_out, const Tensor& input, const Tensor& weight, const ConvShape& s,
              bool cl) {
  // grad_bias alone is a plain sum (done by the caller); oneDNN fills it with grad_weight.
  const DataType dt = data_type(input.dtype());
  const Primitives* p = lookup(s, grad_bias.defined(), dt, cl);
  if (p == nullptr) return false;
  dnnl::stream st(engine());
  std::vector<Tensor> keep;
  const memory gy_user = wrap(user_dst(s, dt, grad_out), grad_out);
  // Both passes usually want grad_out in the same layout: reorder it once.
  memory gy_data, gy_weights;
  if (grad_input.defined()) gy_data = as_layout(gy_user, p->data_pd.diff_dst_desc(), st, keep);
  if (grad_weight.defined()) {
    gy_weights = grad_input.defined() && p->weights_pd.diff_dst_desc() == gy_data.get_desc()
                     ? gy_data
                     : as_layout(gy_user, p->weights_pd.diff_dst_desc(), st, keep);
  }
  if (grad_input.defined()) {
    const memory& gy = gy_data;
    const memory wei =
        as_layout(wrap(user_weights(s, dt, weight), weight), p->data_pd.weights_desc(), st, keep);
    into_user(wrap(user_src(s, dt, grad_input), grad_input), p->data_pd.diff_src_desc(), st, keep,
              [&](const memory& gx) {
                p->data.execute(
                    st, {{DNNL_ARG_DIFF_DST, gy},
                         {DNNL_ARG_WEIGHTS, wei},
                         {DNNL_ARG_DIFF_SRC, gx},
                         {DNNL_ARG_SCRATCHPAD, scratch(p->data_pd.scratchpad_desc(), keep)}});
              });
  }
  if (grad_weight.defined()) {
    const memory& gy = gy_weights;
    const memory src =
        as_layout(wrap(user_src(s, dt, input), input), p->weights_pd.src_desc(), st, keep);
    into_user(wrap(user_weights(s, dt, grad_weight), grad_weight),
              p->weights_pd.diff_weights_desc(), st, keep, [&](const memory& gw) {
                std::unordered_map<int, memory> args{
                    {DNNL_ARG_SRC, src},
                    {DNNL_ARG_DIFF_DST, gy},
                    {DNNL_ARG_DIFF_WEIGHTS, gw},
                    {DNNL_ARG_SCRATCHPAD, scratch(p->weights_pd.scratchpad_desc(), keep)}};
                if (grad_bias.defined()) {
                  args.emplace(DNNL_ARG_DIFF_BIAS, wrap(user_bias(s, dt), grad_bias));
                }
                p->weights.execute(st, args);
              });
  }
  st.wait();
  return true;
}

}  // namespace onednn
#endif

// f16/bf16 run through f32 copies; f32 and f64 run directly.
template <typename Fn>
void with_compute_dtype(DType dtype, Fn&& fn) {
  if (dtype == kF64) {
    fn(TypeTag<double>{}, kF64);
  } else {
    fn(TypeTag<float>{}, kF32);
  }
}

// Writes src into dst when they are different tensors (in-place methods need a handle).
void write_back(const Tensor& dst, const Tensor& src) {
  if (!dst.defined() || dst.is_same(src)) return;
  Tensor handle = dst;
  handle.copy_(src);
}

Tensor as_dtype(const Tensor& t, DType dtype) {
  return !t.defined() || t.dtype() == dtype ? t : t.to(dtype);
}

// Every tensor of a convolution is dense in the layout params.channels_last names.
bool dense_in(const Tensor& t, bool cl) {
  return !t.defined() ||
         t.is_contiguous(cl ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous);
}

// The NCHW copy im2col takes (channels-last tensors are converted; see the file comment).
Tensor nchw(const Tensor& t) { return t.defined() ? t.contiguous() : t; }
Tensor nchw_output(const Tensor& t) {
  return !t.defined() || t.is_contiguous() ? t : empty(t.sizes(), t.options());
}

void conv2d_forward_cpu(const Tensor& out, const Tensor& input, const Tensor& weight,
                        const Tensor& bias, const Conv2dParams& params) {
  const bool cl = params.channels_last;
  EMBER_ASSERT(dense_in(input, cl) && dense_in(weight, cl) && dense_in(out, cl));
  EMBER_ASSERT(!bias.defined() || bias.is_contiguous());
  const ConvShape s = conv_shape(input, weight, out.size(2), out.size(3), params);
  if (out.numel() == 0) return;
#if EMBER_WITH_DNNL
  if (input.dtype() == kBF16 && onednn::native_bf16() &&
      onednn::forward(out, input, weight, bias, s, cl))
    return;
#endif
  with_compute_dtype(input.dtype(), [&](auto tag, DType dt) {
    using T = typename decltype(tag)::type;
    const Tensor o = as_dtype(out, dt);
    const Tensor x = as_dtype(input, dt), w = as_dtype(weight, dt), b = as_dtype(bias, dt);
    bool done = false;
#if EMBER_WITH_DNNL
    if constexpr (std::is_same_v<T, float>) done = onednn::forward(o, x, w, b, s, cl);
#endif
    if (!done) {
      const Tensor oc = nchw_output(o);
      conv_forward_typed<T>(oc, nchw(x), nchw(w), b, s);
      write_back(o, oc);
    }
    write_back(out, o);
  });
}

void conv2d_backward_cpu(const Tensor& grad_input, const Tensor& grad_weight,
                         const Tensor& grad_bias, const Tensor& grad_out, const Tensor& input,
                         const Tensor& weight, const Conv2dParams& params) {
  const bool cl = params.channels_last;
  EMBER_ASSERT(dense_in(grad_out, cl) && dense_in(input, cl) && dense_in(weight, cl));
  EMBER_ASSERT(dense_in(grad_input, cl) && dense_in(grad_weight, cl));
  const ConvShape s = conv_shape(input, weight, grad_out.size(2), grad_out.size(3), params);
#if EMBER_WITH_DNNL
  // bf16 grad_input and grad_weight (with grad_bias) on oneDNN's bf16 kernels; a grad_bias
  // without grad_weight is a plain sum, left to the f32 path below.
  if (input.dtype() == kBF16 && onednn::native_bf16() && s.n > 0 && s.plane_out() > 0 &&
      grad_weight.defined() &&
      onednn::backward(grad_input, grad_weight, grad_bias, grad_out, input, weight, s, cl))
    return;
#endif
  with_compute_dtype(input.dtype(), [&](auto tag, DType dt) {
    using T = typename decltype(tag)::type;
    const Tensor gx = as_dtype(grad_input, dt), gw = as_dtype(grad_weight, dt),
                 gb = as_dtype(grad_bias, dt);
    if (s.n == 0 || s.plane_out() == 0) {
      for (Tensor t : {gx, gw, gb}) {
        if (t.defined()) t.zero_();
      }
    } else {
      const Tensor gy = as_dtype(grad_out, dt), x = as_dtype(input, dt), w = as_dtype(weight, dt);
      bool done = false;
#if EMBER_WITH_DNNL
      // oneDNN computes grad_bias with grad_weight; without it the plain sum below does.
      if constexpr (std::is_same_v<T, float>) {
        if (gx.defined() || gw.defined()) {
          done = onednn::backward(gx, gw, gw.defined() ? gb : Tensor(), gy, x, w, s, cl);
          if (done && gb.defined() && !gw.defined()) {
            conv_backward_typed<T>(Tensor(), Tensor(), gb, nchw(gy), nchw(x), nchw(w), s);
          }
        }
      }
#endif
      if (!done) {
        const Tensor gxc = nchw_output(gx), gwc = nchw_output(gw);
        conv_backward_typed<T>(gxc, gwc, gb, nchw(gy), nchw(x), nchw(w), s);
        write_back(gx, gxc);
        write_back(gw, gwc);
      }
    }
    write_back(grad_input, gx);
    write_back(grad_weight, gw);
    write_back(grad_bias, gb);
  });
}

}  // namespace

EMBER_REGISTER_CPU_KERNELS(conv) {
  table.conv2d_forward = &conv2d_forward_cpu;
  table.conv2d_backward = &conv2d_backward_cpu;
}

}  // namespace ember::detail
