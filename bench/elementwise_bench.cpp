// Memory bandwidth of ember's elementwise add on large contiguous f32 tensors against memcpy
// in the same run. One JSON line per size and variant:
//   add   out = a + b     3 arrays touched (read a, read b, write out), out allocated per call
//   add_  a += b          3 arrays touched (read a, read b, write a), no allocation
// GB/s counts bytes read plus bytes written; memcpy moves the same total (half read, half
// written) between two buffers allocated and touched beforehand. ratio = ember / memcpy.
//
//   elementwise_bench [--quick]   (--quick: up to 4M elements)
#include <cstdint>
#include <cstring>
#include <vector>

#include <ember/ember.h>

#include "bench_util.h"

namespace {

using ember::Tensor;

void report(const char* op, int64_t numel, double bytes, double ember_s, double memcpy_s) {
  const double ember_gbps = bytes / ember_s * 1e-9;
  const double memcpy_gbps = bytes / memcpy_s * 1e-9;
  ember::bench::JsonLine()
      .add("bench", "elementwise")
      .add("op", op)
      .add("dtype", "f32")
      .add("numel", static_cast<long long>(numel))
      .add("bytes_moved", bytes)
      .add("ember_gbps", ember_gbps)
      .add("memcpy_gbps", memcpy_gbps)
      .add("ratio", ember_gbps / memcpy_gbps)
      .print();
}

void bench_size(int64_t numel) {
  Tensor a = ember::rand({numel});
  Tensor b = ember::rand({numel});
  const double bytes = 3.0 * static_cast<double>(numel) * sizeof(float);
  // memcpy of 1.5 arrays reads and writes the same 3 arrays' worth of bytes.
  const size_t copy_bytes = static_cast<size_t>(bytes / 2);
  std::vector<char> src(copy_bytes, 1), dst(copy_bytes, 0);
  auto copy = [&] { std::memcpy(dst.data(), src.data(), copy_bytes); };

  Tensor out;
  const auto t_add = ember::bench::median_seconds({[&] { out = ember::add(a, b); }, copy}, [] {});
  report("add", numel, bytes, t_add[0], t_add[1]);

  // Adds alternately b and -b so that a stays bounded however many times it runs.
  Tensor neg_b = ember::neg(b);
  bool flip = false;
  const auto t_inplace = ember::bench::median_seconds({[&] {
                                                         a.add_(flip ? neg_b : b);
                                                         flip = !flip;
                                                       },
                                                       copy},
                                                      [] {});
  report("add_", numel, bytes, t_inplace[0], t_inplace[1]);
  // Keeps the copies observable.
  if (dst[copy_bytes / 2] != 1) std::printf("memcpy produced a wrong byte\n");
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  ember::manual_seed(0);
  for (int64_t numel : {int64_t{1} << 20, int64_t{4} << 20, int64_t{16} << 20, int64_t{64} << 20}) {
    if (quick && numel > (int64_t{4} << 20)) break;
    bench_size(numel);
  }
  return 0;
}
