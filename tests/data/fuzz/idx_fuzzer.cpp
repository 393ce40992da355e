// libFuzzer harness for the idx reader (raw and gzip-compressed): every input must load
// with exactly the bytes its header implies, or throw ember::Error.
#include <cstring>

#include <ember/tensor/error.h>

#include "../../../data/detail/io.h"
#include "fuzz_common.h"

using ember::data::testing::Bytes;

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  namespace t = ember::data::testing;
  Bytes pixels(2 * 28 * 28);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 7);
  const Bytes images = t::idx({2, 28, 28}, pixels), labels = t::idx({2}, {3, 9});
  Bytes two_members = t::gzip(Bytes(labels.begin(), labels.begin() + 5));
  const Bytes rest = t::gzip(Bytes(labels.begin() + 5, labels.end()));
  two_members.insert(two_members.end(), rest.begin(), rest.end());
  ember::data::fuzz::write_seeds(*argc, *argv,
                                 {{"images", images},
                                  {"labels", labels},
                                  {"images.gz", t::gzip(images)},
                                  {"labels_two_members.gz", two_members}});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ember::data::fuzz::InputFile file(data, size);
  std::vector<uint8_t> out;
  size_t expected = 0;
  try {
    ember::data::detail::read_idx_file(file.path(), "fuzz", [&](const std::vector<int64_t>& dims) {
      expected = 1;
      for (int64_t d : dims) expected *= static_cast<size_t>(d);
      out.assign(expected, 0);
      return out.data();
    });
  } catch (const ember::Error&) {
    return 0;
  }
  // A raw file that loads is its header and exactly its elements.
  if (!(size >= 2 && data[0] == 0x1f && data[1] == 0x8b)) {
    if (size < expected ||
        (expected > 0 && std::memcmp(out.data(), data + size - expected, expected) != 0)) {
      std::abort();
    }
  }
  return 0;
}
