// PyTorch-style printing: tensor([[1., 2.], [3., 4.]], dtype=f64, device='cuda:0').
#include <cmath>
#include <cstdio>
#include <sstream>

#include "tensor.h"

namespace ember {

namespace {

constexpr int64_t kSummarizeThreshold = 1000;  // elements; larger tensors print their edges
constexpr int64_t kEdgeItems = 3;

struct Formatter {
  enum class Style { kInteger, kWholeFloat, kFixed, kScientific } style = Style::kInteger;
  bool is_bool = false;
  size_t width = 1;

  std::string format(double v) const {
    if (is_bool) return v != 0 ? "True" : "False";
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    char buf[64];
    switch (style) {
      case Style::kInteger:
        std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
        break;
      case Style::kWholeFloat:
        std::snprintf(buf, sizeof buf, "%.0f.", v);
        break;
      case Style::kFixed:
        std::snprintf(buf, sizeof buf, "%.4f", v);
        break;
      case Style::kScientific:
        std::snprintf(buf, sizeof buf, "%.4e", v);
        break;
    }
    return buf;
  }
  std::string padded(double v) const {
    std::string s = format(v);
    return std::string(width > s.size() ? width - s.size() : 0, ' ') + s;
  }
};

Formatter make_formatter(const std::vector<double>& values, DType dtype) {
  Formatter f;
  f.is_bool = dtype == kBool;
  if (is_floating(dtype)) {
    bool whole = true;
    double max_abs = 0, min_abs = INFINITY;
    for (double v : values) {
      if (!std::isfinite(v)) continue;
      if (v != std::nearbyint(v)) whole = false;
      max_abs = std::max(max_abs, std::abs(v));
      if (v != 0) min_abs = std::min(min_abs, std::abs(v));
    }
    if (whole) {
      f.style = max_abs >= 1e8 ? Formatter::Style::kScientific : Formatter::Style::kWholeFloat;
    } else {
      const bool wide = max_abs >= 1e8 ||
                        (std::isfinite(min_abs) && (min_abs < 1e-4 || max_abs / min_abs > 1000));
      f.style = wide ? Formatter::Style::kScientific : Formatter::Style::kFixed;
    }
  }
  for (double v : values) f.width = std::max(f.width, f.format(v).size());
  return f;
}

void print_dim(std::ostream& os, const std::vector<double>& values, const Shape& sizes, size_t dim,
               int64_t offset, const Shape& strides, const Formatter& f, bool summarize,
               int indent) {
  const int64_t n = sizes[dim];
  os << '[';
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) {
      os << (dim + 1 == sizes.size()
                 ? " ..., "
                 : "...,\n" + std::string(static_cast<size_t>(indent + 1), ' '));
      i = n - kEdgeItems;
    }
    if (dim + 1 == sizes.size()) {
      os << f.padded(values[static_cast<size_t>(offset + i * strides[dim])]);
    } else {
      print_dim(os, values, sizes, dim + 1, offset + i * strides[dim], strides, f, summarize,
                indent + 1);
    }
    if (i + 1 < n) {
      if (dim + 1 == sizes.size()) {
        os << ", ";
      } else {
        os << ',' << std::string(sizes.size() - dim - 1, '\n')
           << std::string(static_cast<size_t>(indent + 1), ' ');
      }
    }
  }
  os << ']';
}

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::ostringstream os;
  os << "tensor(";
  const bool summarize = numel() > kSummarizeThreshold;
  const std::vector<double> values = to_vector<double>();
  const Formatter f = make_formatter(values, dtype());
  if (dim() == 0) {
    os << f.format(values[0]);
  } else if (numel() == 0) {
    os << "[]";
    if (dim() > 1) os << ", size=" << shape_str(sizes());
  } else {
    Shape strides(sizes().size());
    int64_t s = 1;
    for (size_t d = sizes().size(); d-- > 0;) {
      strides[d] = s;
      s *= sizes()[d];
    }
    print_dim(os, values, sizes(), 0, 0, strides, f, summarize, 7);
  }
  if (dtype() != kF32 && dtype() != kI64 && dtype() != kBool) os << ", dtype=" << dtype();
  if (is_cuda()) os << ", device='" << device().str() << "'";
  os << ')';
  return os.str();
}

std::ostream& operator<<(std::ostream& out, const Tensor& t) { return out << t.str(); }

}  // namespace ember
