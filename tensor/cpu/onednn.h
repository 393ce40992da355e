// What the CPU kernels that run on oneDNN share (builds with EMBER_WITH_DNNL only): the one
// CPU engine, and whether this CPU computes bf16 natively.
#pragma once

#if EMBER_WITH_DNNL
#include <oneapi/dnnl/dnnl.hpp>

namespace ember::detail::onednn {

inline dnnl::engine& engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

// True on CPUs with AVX512-BF16 or AMX, where oneDNN's bf16 kernels (f32 accumulation, one
// rounding of each output) beat widening to f32; elsewhere bf16 goes through f32 copies.
inline bool native_bf16() {
  static const bool native = [] {
    const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
    return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
  }();
  return native;
}

}  // namespace ember::detail::onednn
#endif
