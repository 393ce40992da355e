// The geometry an elementwise kernel walks: up to four operands of one shape (operand 0 is
// the output), their element strides, and the shape with mergeable dims coalesced.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "../tensor.h"

namespace ember::detail {

inline constexpr int kMaxDims = 16;
inline constexpr int kMaxOperands = 4;

struct StridedIter {
  int ndim = 0;  // after coalescing; 0 for a single element
  int num_operands = 0;
  int64_t numel = 0;
  int64_t sizes[kMaxDims] = {};                  // innermost dim last
  int64_t strides[kMaxOperands][kMaxDims] = {};  // in elements
  char* data[kMaxOperands] = {};                 // first element of each operand
  bool contiguous = false;  // every operand dense and in row-major order: flat loops apply

  // Element offset of linear index i for operand op (row-major order of `sizes`).
  int64_t offset(int op, int64_t i) const {
    int64_t result = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t idx = i % sizes[d];
      i /= sizes[d];
      result += idx * strides[op][d];
    }
    return result;
  }
};

// Operands must share the shape of the first; throws InternalError otherwise, and
// ember::Error when the tensors have more than kMaxDims dims.
StridedIter make_iter(std::initializer_list<const Tensor*> operands);

}  // namespace ember::detail
