#include "dtype.h"

#include "scalar.h"

namespace ember {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "f32";
    case DType::kFloat64:
      return "f64";
    case DType::kFloat16:
      return "f16";
    case DType::kBFloat16:
      return "bf16";
    case DType::kInt64:
      return "i64";
    case DType::kInt32:
      return "i32";
    case DType::kUInt8:
      return "u8";
    case DType::kBool:
      return "bool";
  }
  return "unknown";
}

std::string_view dtype_torch_name(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt64:
      return "int64";
    case DType::kInt32:
      return "int32";
    case DType::kUInt8:
      return "uint8";
    case DType::kBool:
      return "bool";
  }
  return "unknown";
}

std::ostream& operator<<(std::ostream& out, DType t) { return out << dtype_name(t); }

namespace {
// Rank within a category: bool < u8 < i32 < i64 < (f16, bf16) < f32 < f64.
int category(DType t) { return t == kBool ? 0 : is_floating(t) ? 2 : 1; }
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  const int ca = category(a), cb = category(b);
  if (ca != cb) return ca > cb ? a : b;
  if (ca == 1) {  // integers: the wider wins (u8 with i32/i64 fits in the signed type)
    return element_size(a) >= element_size(b) ? a : b;
  }
  // floats
  if ((a == kF16 && b == kBF16) || (a == kBF16 && b == kF16)) return kF32;
  return element_size(a) >= element_size(b) ? a : b;
}

std::ostream& operator<<(std::ostream& out, const Scalar& s) {
  switch (s.kind()) {
    case Scalar::Kind::kBoolean:
      return out << (s.to_bool() ? "True" : "False");
    case Scalar::Kind::kIntegral:
      return out << s.to_int();
    case Scalar::Kind::kFloating:
      return out << s.to_double();
  }
  return out;
}

}  // namespace ember
