// What the emulated CUDA tests share: a kernel family's emulated table entries run on CPU
// tensors against the CPU kernels (parity), and the planted bugs of emulate.h, under which the
// same run must fail.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <ember/ember.h>
#include <ember/tensor/cuda/emulated/emulate.h>
#include <ember/tensor/detail/kernel_table.h>

namespace ember::testing {

using detail::KernelTable;

// The table entries Register (a family's detail::emulated::register_cuda_*) fills.
template <void (*Register)(KernelTable&)>
const KernelTable& emulated_table() {
  static const KernelTable table = [] {
    KernelTable t;
    Register(t);
    return t;
  }();
  return table;
}
inline const KernelTable& cpu_table() { return detail::kernel_table(DeviceType::kCPU); }

// A tensor of `shape` with every byte 0xff (NaN for floats, -1 for integers), so an element no
// kernel writes shows.
inline Tensor poisoned(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  if (t.nbytes() != 0) std::memset(t.data_ptr(), 0xff, t.nbytes());
  return t;
}

// Values in [-2, 2) (integers: [-5, 5); bool: 0/1) of `dtype`, drawn from `seed`.
inline Tensor random_input(const Shape& shape, DType dtype, uint64_t seed) {
  Generator gen(seed);
  if (dtype == kBool) return gt(uniform(shape, 0.0, 1.0, kF32, &gen), Scalar(0.5));
  if (!is_floating(dtype)) return randint(-5, 5, shape, kI64, &gen).to(dtype);
  return uniform(shape, -2.0, 2.0, kF32, &gen).to(dtype);
}

// The first element where `got` and `want` differ by more than atol + rtol |want| (NaN must
// meet NaN), as a message; nullopt when they agree.
inline std::optional<std::string> mismatch(const Tensor& got, const Tensor& want, double rtol,
                                           double atol) {
  if (got.sizes() != want.sizes() || got.dtype() != want.dtype()) {
    return "shape/dtype " + shape_str(got.sizes()) + " vs " + shape_str(want.sizes());
  }
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) {
    const bool ok = std::isnan(w[i])   ? std::isnan(g[i])
                    : std::isinf(w[i]) ? g[i] == w[i]
                                       : std::abs(g[i] - w[i]) <= atol + rtol * std::abs(w[i]);
    if (!ok) {
      std::ostringstream s;
      s << "at flat index " << i << " of " << shape_str(got.sizes()) << ": " << g[i] << " vs "
        << w[i];
      return s.str();
    }
  }
  return std::nullopt;
}

// A few ulps of math in the compute type, then one rounding to `dtype` that may land on the
// neighbouring 16-bit value: the relative (and absolute) slack of a parity check.
inline double tolerance(DType dtype) {
  switch (dtype) {
    case kF64:
      return 1e-12;
    case kF32:
      return 2e-5;
    case kF16:
      return 2e-3;
    case kBF16:
      return 1e-2;
    default:
      return 0.0;
  }
}

// The outputs of one run of an op through a kernel table.
using Outputs = std::vector<Tensor>;
using KernelRun = std::function<Outputs(const KernelTable&)>;

// run() with the emulated blocks' threads starting forward, then again starting in reverse.
inline std::vector<Outputs> in_both_orders(const std::function<Outputs()>& run) {
  struct Restore {
    ~Restore() { cuda_emu::set_order(cuda_emu::Order::kAlternate); }
  } restore;
  std::vector<Outputs> results;
  for (auto order : {cuda_emu::Order::kForwardFirst, cuda_emu::Order::kReverseFirst}) {
    cuda_emu::set_order(order);
    results.push_back(run());
  }
  return results;
}

// run(emulated), in both thread orders, against run(cpu_table()), output by output.
inline void expect_parity(const KernelTable& emulated, const KernelRun& run, double rtol = 0.0,
                          double atol = 0.0) {
  const Outputs want = run(cpu_table());
  for (const Outputs& got : in_both_orders([&] { return run(emulated); })) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const auto m = mismatch(got[i], want[i], rtol, atol);
      EXPECT_FALSE(m.has_value()) << "output " << i << ": " << *m;
    }
  }
}

// Whether run(emulated) with `bug` planted fails (in either thread order): throws, or differs
// from the CPU kernels. The bug must have been hit.
inline void expect_planted_bug_fails(const KernelTable& emulated, const KernelRun& run, cuda_emu::Bug bug,
                                     int which = 0, double rtol = 0.0, double atol = 0.0) {
  const Outputs want = run(cpu_table());
  bool failed = false;
  int64_t hits = 0;
  {
    const cuda_emu::PlantedBug planted(bug, which);
    try {
      for (const Outputs& got : in_both_orders([&] { return run(emulated); })) {
        for (size_t i = 0; i < got.size(); ++i) {
          failed = failed || mismatch(got[i], want[i], rtol, atol).has_value();
        }
      }
    } catch (const Error&) {
      failed = true;
    }
    hits = planted.hits();
  }
  EXPECT_GT(hits, 0) << "the planted bug " << static_cast<int>(bug) << " never ran";
  EXPECT_TRUE(failed) << "the planted bug " << static_cast<int>(bug) << " went unnoticed";
}

}  // namespace ember::testing
