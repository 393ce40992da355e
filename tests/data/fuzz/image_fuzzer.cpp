// libFuzzer harness for image decoding (PNG, JPEG, BMP and the refusal of other formats):
// every input must decode to exactly height x width x channels bytes, or throw ember::Error.
// The first byte picks the channels (1, 3 or 4).
#include <ember/tensor/error.h>

#include "../../../data/detail/image.h"
#include "fuzz_common.h"

using ember::data::testing::Bytes;

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  namespace t = ember::data::testing;
  Bytes hwc(6 * 5 * 4);
  for (size_t i = 0; i < hwc.size(); ++i) hwc[i] = static_cast<uint8_t>(i * 11);
  const auto with = [](uint8_t channels, const Bytes& file) {
    Bytes out = {channels};
    out.insert(out.end(), file.begin(), file.end());
    return out;
  };
  ember::data::fuzz::write_seeds(*argc, *argv,
                                 {{"rgb.png", with(3, t::png(6, 5, 3, hwc))},
                                  {"rgba.png", with(4, t::png(6, 5, 4, hwc))},
                                  {"grey16.png", with(1, t::png(6, 5, 1, hwc, 16))},
                                  {"bottom_up.bmp", with(3, t::bmp(6, 5, hwc))},
                                  {"top_down.bmp", with(1, t::bmp(5, 4, hwc, true))},
                                  {"a.jpg", with(3, t::jpeg_8x8())},
                                  {"grey.jpg", with(1, t::jpeg_8x8())}});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const int kChannels[] = {1, 3, 4};
  const int channels = kChannels[data[0] % 3];
  std::vector<uint8_t> pixels;
  int64_t expected = -1;
  try {
    // 2^22 pixels: bounded memory, still far more than the inputs can describe honestly.
    ember::data::detail::decode_image_bytes(data + 1, size - 1, "fuzz input", channels,
                                            int64_t{1} << 22,
                                            [&](int64_t height, int64_t width, int c) {
                                              if (height <= 0 || width <= 0 || c != channels)
                                                std::abort();
                                              expected = height * width * c;
                                              pixels.assign(static_cast<size_t>(expected), 0xcd);
                                              return pixels.data();
                                            });
  } catch (const ember::Error&) {
    return 0;
  }
  if (expected < 0 || pixels.size() != static_cast<size_t>(expected)) std::abort();
  return 0;
}
