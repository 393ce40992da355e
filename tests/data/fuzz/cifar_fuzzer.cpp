// libFuzzer harness for the CIFAR binary reader: every input must load as whole records
// with labels in range, or throw ember::Error. The first byte picks CIFAR-10 (even) or
// CIFAR-100 (odd) records.
#include <ember/tensor/error.h>

#include "../../../data/detail/io.h"
#include "fuzz_common.h"

using ember::data::testing::Bytes;

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  namespace t = ember::data::testing;
  Bytes ten = {0}, hundred = {1};
  const Bytes r10 = t::cifar_records({{1}, {9}}, 0), r100 = t::cifar_records({{19, 99}}, 3);
  ten.insert(ten.end(), r10.begin(), r10.end());
  hundred.insert(hundred.end(), r100.begin(), r100.end());
  ember::data::fuzz::write_seeds(*argc, *argv, {{"cifar10", ten}, {"cifar100", hundred}});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  ember::data::fuzz::InputFile file(data + 1, size - 1);
  const std::vector<int64_t> limits =
      data[0] % 2 == 0 ? std::vector<int64_t>{10} : std::vector<int64_t>{20, 100};
  std::vector<uint8_t> pixels;
  std::vector<std::vector<int64_t>> labels(limits.size());
  try {
    ember::data::detail::read_cifar_file(file.path(), "fuzz", limits, 10'000, pixels, labels);
  } catch (const ember::Error&) {
    return 0;
  }
  const size_t records = (size - 1) / (limits.size() + 3072);
  if (pixels.size() != records * 3072) std::abort();
  for (size_t k = 0; k < limits.size(); ++k) {
    if (labels[k].size() != records) std::abort();
    for (int64_t label : labels[k]) {
      if (label < 0 || label >= limits[k]) std::abort();
    }
  }
  return 0;
}
