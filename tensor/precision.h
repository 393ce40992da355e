// TF32 policy: whether float32 matmuls and convolutions on CUDA may run on TF32 tensor cores
// (a 10-bit mantissa for the products, f32 accumulation: about 8x the f32 throughput on
// Ampere/Hopper, relative error about 1e-3 instead of 1e-7). Process-wide, as PyTorch's.
//
// Defaults are PyTorch's, on purpose, so a model ported from PyTorch runs at the same speed
// and precision:
//   - matmul (linear, matmul, bmm, addmm on cuBLAS): "highest", no TF32
//     (torch.get_float32_matmul_precision() == "highest", torch.backends.cuda.matmul.allow_tf32
//     == False);
//   - convolutions (cuDNN): TF32 allowed (torch.backends.cudnn.allow_tf32 == True).
// For full-f32 convolutions (bit-for-bit closer to the CPU) call set_cudnn_allow_tf32(false);
// for TF32 matmuls set_float32_matmul_precision("high"). CPU kernels always compute in f32.
// f16/bf16 and f64 ops are unaffected.
#pragma once

#include <string>

namespace ember {

enum class MatmulPrecision { kHighest, kHigh, kMedium };

// "highest": f32 matmuls in f32. "high" and "medium": TF32 allowed on CUDA (PyTorch's CUDA
// backend treats both as TF32; ember's CPU matmuls stay f32 for both). Any other string throws
// ember::Error naming it.
void set_float32_matmul_precision(const std::string& precision);
std::string get_float32_matmul_precision();
MatmulPrecision float32_matmul_precision();
// True unless the matmul precision is "highest" (torch.backends.cuda.matmul.allow_tf32).
bool matmul_allow_tf32();

// Whether cuDNN may use TF32 for f32 convolutions (torch.backends.cudnn.allow_tf32).
void set_cudnn_allow_tf32(bool allow);
bool cudnn_allow_tf32();

// Sets both switches for a scope and restores the previous ones on exit, as
// torch.backends.cudnn.flags(allow_tf32=...) does for cuDNN:
//   Float32PrecisionGuard exact("highest", false);  // full-f32 matmuls and convolutions
class Float32PrecisionGuard {
 public:
  Float32PrecisionGuard(const std::string& matmul_precision, bool cudnn_allow_tf32);
  ~Float32PrecisionGuard();
  Float32PrecisionGuard(const Float32PrecisionGuard&) = delete;
  Float32PrecisionGuard& operator=(const Float32PrecisionGuard&) = delete;

 private:
  MatmulPrecision matmul_;
  bool cudnn_;
};

}  // namespace ember
