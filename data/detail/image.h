// Image decoding (private): PNG through libpng, JPEG through libjpeg(-turbo), BMP through
// ember's own reader. Nothing here uses Tensor, so the fuzz harness compiles it on its own.
//
// Why these decoders: libpng and libjpeg are the reference decoders of their formats and
// report truncation, CRC and Adler-32 mismatches and bad entropy-coded data precisely, where a
// catch-all decoder zero-fills what is missing. BMP (uncompressed 8-, 24- and 32-bit) is a
// header and rows, which a checked reader of a hundred lines handles exactly. The format is
// recognised by the file's magic bytes, never its extension; any other format is refused by
// name.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace ember::data::detail {

// Where decoded pixels go: called once with the image's size, returns h * w * channels bytes.
using ImageAllocate = std::function<uint8_t*(int64_t height, int64_t width, int channels)>;

// Decodes `size` bytes of a PNG, JPEG or BMP file to 8-bit HWC with `channels` channels (1
// grey, 3 RGB, 4 RGBA: converted as PIL's convert("L"/"RGB"/"RGBA") does). `name` is the
// file named in errors. Images with more than `max_pixels` pixels are refused before any
// pixel buffer is allocated.
void decode_image_bytes(const uint8_t* data, size_t size, const std::string& name, int channels,
                        int64_t max_pixels, const ImageAllocate& allocate);

}  // namespace ember::data::detail
