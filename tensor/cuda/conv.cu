// conv2d on cuDNN. Algorithms are benchmarked once per (device, kind, dtype, shape, params,
// alignment) with cudnnFind*Ex, as PyTorch's cudnn.benchmark, and cached for the process;
// workspaces come from the caching allocator. f32 may use TF32 tensor cores while
// cudnn_allow_tf32() (PyTorch's default, tensor/precision.h), else FMA-only kernels that match
// the CPU's within float rounding; f64 runs FMA; f16/bf16 may use tensor cores. The bias is
// added and reduced by small kernels of ours.
#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <vector>

#include "../detail/dispatch.h"
#include "../precision.h"
#include "block_sum.cuh"
#include "launch.cuh"
#if !defined(EMBER_CUDA_EMULATED)
#include "cudnn_context.h"
#endif

EMBER_KERNELS_BEGIN
namespace {

constexpr const char* kOp = "conv2d";
#if !defined(EMBER_CUDA_EMULATED)  // cuDNN: GPU-only (emulated builds take the bias kernels alone)
// Upper bound on the scratch memory the benchmark offers the candidate algorithms.
constexpr size_t kMaxBenchmarkWorkspace = size_t{1} << 29;

enum class ConvKind : int64_t { kForward, kBackwardData, kBackwardFilter };

struct AlgoChoice {
  int algo = 0;
  size_t workspace = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

using AlgoKey = std::array<int64_t, 21>;

struct AlgoCache {
  std::mutex mutex;
  std::map<AlgoKey, AlgoChoice> choices;
};

AlgoCache& algo_cache() {
  static AlgoCache* cache = new AlgoCache();  // lives for the process, like the handles
  return *cache;
}

// The largest power of two (up to 16) dividing the address: some algorithms need aligned data.
int64_t alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  int64_t a = 1;
  while (a < 16 && v % static_cast<uintptr_t>(a * 2) == 0) a *= 2;
  return a;
}

bool tensor_ops_allowed(DType dtype, bool allow_tf32) {
  return dtype == kF16 || dtype == kBF16 || (dtype == kF32 && allow_tf32);
}

bool is_tensor_op(cudnnMathType_t math) {
  return math == CUDNN_TENSOR_OP_MATH || math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

// Descriptors of one convolution: input x [N, C, H, W], weight w [O, C/g, kH, kW], output y.
struct ConvSetup {
  ConvSetup(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p)
      : dtype(x.dtype()), device(x.device().index), allow_tf32(cudnn_allow_tf32()) {
    const cudnnDataType_t type = cudnn_data_type(dtype, kOp);
    const bool cl = p.channels_last;  // NHWC descriptors: cuDNN's tensor-core layout
    x_desc.set(type, x.size(0), x.size(1), x.size(2), x.size(3), kOp, cl);
    y_desc.set(type, y.size(0), y.size(1), y.size(2), y.size(3), kOp, cl);
    w_desc.set(type, w.size(0), w.size(1), w.size(2), w.size(3), kOp, cl);
    EMBER_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        conv_desc.get(), cudnn_int(p.padding[0], kOp), cudnn_int(p.padding[1], kOp),
        cudnn_int(p.stride[0], kOp), cudnn_int(p.stride[1], kOp), cudnn_int(p.dilation[0], kOp),
        cudnn_int(p.dilation[1], kOp), CUDNN_CROSS_CORRELATION,
        dtype == kF64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT));
    EMBER_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv_desc.get(), cudnn_int(p.groups, kOp)));
    set_math(CUDNN_TENSOR_OP_MATH);
    key = {0,
           device,
           static_cast<int64_t>(dtype),
           x.size(0),
           x.size(1),
           x.size(2),
           x.size(3),
           w.size(0),
           w.size(2),
           w.size(3),
           p.stride[0],
           p.stride[1],
           p.padding[0],
           p.padding[1],
           p.dilation[0],
           p.dilation[1],
           p.groups,
           std::min({alignment(x.data_ptr()), alignment(w.data_ptr()), alignment(y.data_ptr())}),
           dtype == kF32 && allow_tf32,
           0,
           cl};
  }

  // f32 without TF32 stays on FMA kernels whatever the benchmark reported (with TF32, as
  // PyTorch, the default math, which admits it); f64 has no other.
  void set_math(cudnnMathType_t math) {
    if (dtype == kF32)
      math = allow_tf32 ? (math == CUDNN_FMA_MATH ? math : CUDNN_DEFAULT_MATH) : CUDNN_FMA_MATH;
    if (dtype == kF64) math = CUDNN_DEFAULT_MATH;
    EMBER_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc.get(), math));
  }

  AlgoKey key_for(ConvKind kind) const {
    AlgoKey k = key;
    k[0] = static_cast<int64_t>(kind);
    return k;
  }

  DType dtype;
  int device;
  bool allow_tf32;  // the policy when this convolution was set up (part of the cache key)
  TensorDescriptor x_desc, y_desc;
  FilterDescriptor w_desc;
  ConvolutionDescriptor conv_desc;
  AlgoKey key{};
};

// The fastest successful result (cuDNN sorts them by time) that fits the workspace and, for
// f32 without TF32 and f64, runs without tensor cores.
template <typename Perf>
AlgoChoice pick(const std::vector<Perf>& perfs, int count, size_t workspace, DType dtype,
                bool allow_tf32, const char* what) {
  for (int i = 0; i < count; ++i) {
    const Perf& p = perfs[static_cast<size_t>(i)];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > workspace) continue;
    if (!tensor_ops_allowed(dtype, allow_tf32) && is_tensor_op(p.mathType)) continue;
    return {static_cast<int>(p.algo), p.memory, p.mathType};
  }
  throw Error(str_cat(kOp, ": cuDNN found no usable ", what, " algorithm for dtype ", dtype));
}

// The cached choice for `kind`, or the result of `find` (which benchmarks) stored for next time.
template <typename Find>
AlgoChoice cached_choice(const ConvSetup& s, ConvKind kind, const Find& find) {
  const AlgoKey key = s.key_for(kind);
  AlgoCache& cache = algo_cache();
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    const auto it = cache.choices.find(key);
    if (it != cache.choices.end()) return it->second;
  }
  const AlgoChoice choice = find();
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.choices.emplace(key, choice);
  return choice;
}

// The scratch size the benchmark offers: the most any candidate asks for, capped.
template <typename SizeOf>
size_t benchmark_workspace(int algo_count, const SizeOf& size_of) {
  size_t most = 0;
  for (int a = 0; a < algo_count; ++a) {
    size_t bytes = 0;
    if (size_of(a, &bytes) == CUDNN_STATUS_SUCCESS && bytes <= kMaxBenchmarkWorkspace) {
      most = std::max(most, bytes);
    }
  }
  return most;
}

AlgoChoice forward_algo(const CudnnHandle& h, ConvSetup& s, const void* x, const void* w, void* y) {
  return cached_choice(s, ConvKind::kForward, [&] {
    const size_t limit =
        benchmark_workspace(CUDNN_CONVOLUTION_FWD_ALGO_COUNT, [&](int a, size_t* b) {
          return cudnnGetConvolutionForwardWorkspaceSize(
              h.get(), s.x_desc.get(), s.w_desc.get(), s.conv_desc.get(), s.y_desc.get(),
              static_cast<cudnnConvolutionFwdAlgo_t>(a), b);
        });
    const Tensor ws = cudnn_workspace(limit, Device(DeviceType::kCUDA, s.device));
    int max_count = 0, count = 0;
    EMBER_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h.get(), &max_count));
    std::vector<cudnnConvolutionFwdAlgoPerf_t> perfs(static_cast<size_t>(std::max(max_count, 1)));
    EMBER_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(
        h.get(), s.x_desc.get(), x, s.w_desc.get(), w, s.conv_desc.get(), s.y_desc.get(), y,
        static_cast<int>(perfs.size()), &count, perfs.data(),
        ws.defined() ? ws.data_ptr() : nullptr, limit));
    return pick(perfs, count, limit, s.dtype, s.allow_tf32, "forward");
  });
}

AlgoChoice backward_data_algo(const CudnnHandle& h, ConvSetup& s, const void* w, const void* dy,
                              void* dx) {
  return cached_choice(s, ConvKind::kBackwardData, [&] {
    const size_t limit =
        benchmark_workspace(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, [&](int a, size_t* b) {
          return cudnnGetConvolutionBackwardDataWorkspaceSize(
              h.get(), s.w_desc.get(), s.y_desc.get(), s.conv_desc.get(), s.x_desc.get(),
              static_cast<cudnnConvolutionBwdDataAlgo_t>(a), b);
        });
    const Tensor ws = cudnn_workspace(limit, Device(DeviceType::kCUDA, s.device));
    int max_count = 0, count = 0;
    EMBER_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h.get(), &max_count));
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perfs(
        static_cast<size_t>(std::max(max_count, 1)));
    EMBER_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
        h.get(), s.w_desc.get(), w, s.y_desc.get(), dy, s.conv_desc.get(), s.x_desc.get(), dx,
        static_cast<int>(perfs.size()), &count, perfs.data(),
        ws.defined() ? ws.data_ptr() : nullptr, limit));
    return pick(perfs, count, limit, s.dtype, s.allow_tf32, "backward-data");
  });
}

AlgoChoice backward_filter_algo(const CudnnHandle& h, ConvSetup& s, const void* x, const void* dy,
                                void* dw) {
  return cached_choice(s, ConvKind::kBackwardFilter, [&] {
    const size_t limit =
        benchmark_workspace(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, [&](int a, size_t* b) {
          return cudnnGetConvolutionBackwardFilterWorkspaceSize(
              h.get(), s.x_desc.get(), s.y_desc.get(), s.conv_desc.get(), s.w_desc.get(),
              static_cast<cudnnConvolutionBwdFilterAlgo_t>(a), b);
        });
    const Tensor ws = cudnn_workspace(limit, Device(DeviceType::kCUDA, s.device));
    int max_count = 0, count = 0;
    EMBER_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h.get(), &max_count));
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perfs(
        static_cast<size_t>(std::max(max_count, 1)));
    EMBER_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
        h.get(), s.x_desc.get(), x, s.y_desc.get(), dy, s.conv_desc.get(), s.w_desc.get(), dw,
        static_cast<int>(perfs.size()), &count, perfs.data(),
        ws.defined() ? ws.data_ptr() : nullptr, limit));
    return pick(perfs, count, limit, s.dtype, s.allow_tf32, "backward-filter");
  });
}

#endif  // !EMBER_CUDA_EMULATED

// y [N, O, P] += bias [O].
template <typename T>
__global__ void add_bias_kernel(T* y, const T* bias, int64_t total, int64_t channels,
                                int64_t plane) {
  using C = acc_t<T>;
  for (int64_t i = global_thread(); i < total; i += grid_stride()) {
    const int64_t o = (i / plane) % channels;
    y[i] = cast_to<T>(cast_to<C>(y[i]) + cast_to<C>(bias[o]));
  }
}

// grad_bias [O] = sum of grad_out [N, O, P] over N and P; one block per channel.
template <typename T>
__global__ void bias_grad_kernel(T* grad_bias, const T* grad_out, int64_t n, int64_t channels,
                                 int64_t plane) {
  EMBER_SHARED(double, shared, [kBlockSize]);
  const int64_t count = n * plane;
  for (int64_t o = blockIdx.x; o < channels; o += gridDim.x) {
    double sum = 0;
    for (int64_t i = threadIdx.x; i < count; i += kBlockSize) {
      sum += cast_to<double>(grad_out[((i / plane) * channels + o) * plane + i % plane]);
    }
    sum = block_sum<kBlockSize>(sum, shared);
    if (threadIdx.x == 0) grad_bias[o] = cast_to<T>(sum);
  }
}

// The [N, O, P] geometry the bias kernels walk: NCHW, or channels-last rows as [N * P, O, 1].
struct BiasGeometry {
  int64_t n, channels, plane;
};
BiasGeometry bias_geometry(const Tensor& y, bool channels_last) {
  const int64_t plane = y.size(2) * y.size(3);
  return channels_last ? BiasGeometry{y.size(0) * plane, y.size(1), 1}
                       : BiasGeometry{y.size(0), y.size(1), plane};
}

// y += bias [O] on `stream`.
void add_bias(const Tensor& out, const Tensor& bias, bool channels_last, cudaStream_t stream) {
  const BiasGeometry g = bias_geometry(out, channels_last);
  dispatch_floating(out.dtype(), kOp, [&](auto tag) {
    using T = typename decltype(tag)::type;
    EMBER_LAUNCH(grid_for(out.numel()), kBlockSize, 0, stream, add_bias_kernel<T>)
    (out.data_ptr<T>(), bias.data_ptr<T>(), out.numel(), g.channels, g.plane);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

// grad_bias [O] = the sums of grad_out over all but the channel dim, on `stream`.
void bias_grad(const Tensor& grad_bias, const Tensor& grad_out, bool channels_last,
               cudaStream_t stream) {
  const int64_t channels = grad_bias.numel();
  const BiasGeometry g = bias_geometry(grad_out, channels_last);
  dispatch_floating(grad_bias.dtype(), kOp, [&](auto tag) {
    using T = typename decltype(tag)::type;
    EMBER_LAUNCH(static_cast<unsigned>(std::min<int64_t>(channels, kMaxGridBlocks)), kBlockSize, 0,
                 stream, bias_grad_kernel<T>)
    (grad_bias.data_ptr<T>(), grad_out.data_ptr<T>(), g.n, channels, g.plane);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

#if !defined(EMBER_CUDA_EMULATED)  // cuDNN: GPU-only (emulated builds take the bias kernels alone)
void zero(const Tensor& t, cudaStream_t stream) {
  if (t.defined() && t.numel() > 0) {
    EMBER_CUDA_CHECK(cudaMemsetAsync(t.data_ptr(), 0, t.nbytes(), stream));
  }
}

void conv2d_forward_cuda(const Tensor& out, const Tensor& input, const Tensor& weight,
                         const Tensor& bias, const Conv2dParams& params) {
  const MemoryFormat format =
      params.channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  EMBER_ASSERT(input.is_contiguous(format) && weight.is_contiguous(format) &&
               out.is_contiguous(format));
  if (out.numel() == 0) return;
  if (input.numel() == 0 || weight.numel() == 0) {  // no input channels: only the bias
    const KernelContext ctx(out);
    zero(out, ctx.stream);
    if (bias.defined()) add_bias(out, bias, params.channels_last, ctx.stream);
    return;
  }
  ConvSetup s(input, weight, out, params);
  CudnnHandle h(s.device);
  const AlgoChoice c = forward_algo(h, s, input.data_ptr(), weight.data_ptr(), out.data_ptr());
  const Tensor ws = cudnn_workspace(c.workspace, input.device());
  s.set_math(c.math);
  const CudnnScale scale(s.dtype);
  EMBER_CUDNN_CHECK(cudnnConvolutionForward(h.get(), scale.one(), s.x_desc.get(), input.data_ptr(),
                                            s.w_desc.get(), weight.data_ptr(), s.conv_desc.get(),
                                            static_cast<cudnnConvolutionFwdAlgo_t>(c.algo),
                                            ws.defined() ? ws.data_ptr() : nullptr, c.workspace,
                                            scale.zero(), s.y_desc.get(), out.data_ptr()));
  if (bias.defined()) add_bias(out, bias, params.channels_last, h.stream());
}

void conv2d_backward_cuda(const Tensor& grad_input, const Tensor& grad_weight,
                          const Tensor& grad_bias, const Tensor& grad_out, const Tensor& input,
                          const Tensor& weight, const Conv2dParams& params) {
  const MemoryFormat format =
      params.channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  EMBER_ASSERT(grad_out.is_contiguous(format) && input.is_contiguous(format) &&
               weight.is_contiguous(format));
  const KernelContext ctx(input);
  if (grad_bias.defined() && grad_bias.numel() > 0) {
    bias_grad(grad_bias, grad_out, params.channels_last, ctx.stream);
  }
  if (grad_out.numel() == 0 || input.numel() == 0 || weight.numel() == 0) {
    zero(grad_input, ctx.stream);  // nothing flows back through an empty product
    zero(grad_weight, ctx.stream);
    return;
  }
  ConvSetup s(input, weight, grad_out, params);
  CudnnHandle h(s.device);
  const CudnnScale scale(s.dtype);
  if (grad_input.defined()) {
    const AlgoChoice c =
        backward_data_algo(h, s, weight.data_ptr(), grad_out.data_ptr(), grad_input.data_ptr());
    const Tensor ws = cudnn_workspace(c.workspace, input.device());
    s.set_math(c.math);
    EMBER_CUDNN_CHECK(cudnnConvolutionBackwardData(
        h.get(), scale.one(), s.w_desc.get(), weight.data_ptr(), s.y_desc.get(),
        grad_out.data_ptr(), s.conv_desc.get(), static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo),
        ws.defined() ? ws.data_ptr() : nullptr, c.workspace, scale.zero(), s.x_desc.get(),
        grad_input.data_ptr()));
  }
  if (grad_weight.defined()) {
    const AlgoChoice c =
        backward_filter_algo(h, s, input.data_ptr(), grad_out.data_ptr(), grad_weight.data_ptr());
    const Tensor ws = cudnn_workspace(c.workspace, input.device());
    s.set_math(c.math);
    EMBER_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
        h.get(), scale.one(), s.x_desc.get(), input.data_ptr(), s.y_desc.get(), grad_out.data_ptr(),
        s.conv_desc.get(), static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo),
        ws.defined() ? ws.data_ptr() : nullptr, c.workspace, scale.zero(), s.w_desc.get(),
        grad_weight.data_ptr()));
  }
}

#endif  // !EMBER_CUDA_EMULATED

}  // namespace

#if !defined(EMBER_CUDA_EMULATED)
EMBER_REGISTER_CUDA_KERNELS(conv) {
  table.conv2d_forward = &conv2d_forward_cuda;
  table.conv2d_backward = &conv2d_backward_cuda;
}

#endif

EMBER_KERNELS_END  // namespace ember::detail
