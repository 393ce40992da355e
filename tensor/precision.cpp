#include "precision.h"

#include <atomic>

#include "error.h"

namespace ember {
namespace {

std::atomic<MatmulPrecision> g_matmul{MatmulPrecision::kHighest};
std::atomic<bool> g_cudnn_tf32{true};

MatmulPrecision parse_precision(const std::string& precision) {
  if (precision == "highest") return MatmulPrecision::kHighest;
  if (precision == "high") return MatmulPrecision::kHigh;
  if (precision == "medium") return MatmulPrecision::kMedium;
  throw Error(detail::str_cat("set_float32_matmul_precision: unknown precision \"", precision,
                              "\" (expected \"highest\", \"high\" or \"medium\")"));
}

}  // namespace

void set_float32_matmul_precision(const std::string& precision) {
  g_matmul.store(parse_precision(precision));
}

MatmulPrecision float32_matmul_precision() { return g_matmul.load(); }

std::string get_float32_matmul_precision() {
  switch (g_matmul.load()) {
    case MatmulPrecision::kHighest:
      return "highest";
    case MatmulPrecision::kHigh:
      return "high";
    case MatmulPrecision::kMedium:
      return "medium";
  }
  return "highest";
}

bool matmul_allow_tf32() { return g_matmul.load() != MatmulPrecision::kHighest; }

void set_cudnn_allow_tf32(bool allow) { g_cudnn_tf32.store(allow); }
bool cudnn_allow_tf32() { return g_cudnn_tf32.load(); }

Float32PrecisionGuard::Float32PrecisionGuard(const std::string& matmul_precision, bool cudnn_allow)
    : matmul_(g_matmul.load()), cudnn_(g_cudnn_tf32.load()) {
  g_matmul.store(parse_precision(matmul_precision));
  g_cudnn_tf32.store(cudnn_allow);
}

Float32PrecisionGuard::~Float32PrecisionGuard() {
  g_matmul.store(matmul_);
  g_cudnn_tf32.store(cudnn_);
}

}  // namespace ember
