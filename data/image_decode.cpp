// PNG (libpng), JPEG (libjpeg) and BMP (below) decoding to 8-bit HWC; see detail/image.h.
//
// libpng and libjpeg report errors by longjmp. Each setjmp lives in a small function whose
// locals are all trivial (state goes through a pointer to a struct owned by the caller), so
// a longjmp skips no destructor; the C++ caller then throws with the decoder's message.
// jpeglib.h needs size_t and FILE declared before it, and jerror.h comes after it.
#include <cstddef>
#include <cstdio>

#include <jpeglib.h>

#include <jerror.h>
#include <png.h>

#include <algorithm>
#include <csetjmp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <ember/tensor/error.h>

#include "detail/image.h"
#include "detail/io.h"

namespace ember::data::detail {
namespace {

const char* const kOp = "decode_image";
const char* const kFormats = "ember reads PNG, JPEG and BMP";

bool starts_with(const uint8_t* data, size_t size, const char* magic, size_t n) {
  return size >= n && std::memcmp(data, magic, n) == 0;
}

// The name of a format ember recognises but does not read, or nullptr.
const char* other_format(const uint8_t* d, size_t n) {
  if (starts_with(d, n, "GIF87a", 6) || starts_with(d, n, "GIF89a", 6)) return "a GIF";
  if (n >= 3 && d[0] == 'P' && d[1] >= '1' && d[1] <= '7' &&
      (d[2] == ' ' || d[2] == '\n' || d[2] == '\r' || d[2] == '\t')) {
    static const char* const kNetpbm[] = {"a PBM", "a PGM", "a PPM", "a PBM",
                                          "a PGM", "a PPM", "a PAM"};
    return kNetpbm[d[1] - '1'];
  }
  if (starts_with(d, n, "#?RADIANCE", 10) || starts_with(d, n, "#?RGBE", 6)) {
    return "a Radiance HDR";
  }
  if (starts_with(d, n, "8BPS", 4)) return "a PSD";
  if (starts_with(d, n, "II*\0", 4) || starts_with(d, n, "MM\0*", 4)) return "a TIFF";
  if (starts_with(d, n, "RIFF", 4) && n >= 12 && std::memcmp(d + 8, "WEBP", 4) == 0) {
    return "a WebP";
  }
  if (starts_with(d, n, "qoif", 4)) return "a QOI";
  if (starts_with(d, n, "\x53\x80\xf6\x34", 4)) return "a Softimage PIC";
  if (starts_with(d, n, "\0\0\1\0", 4)) return "an ICO";
  if (starts_with(d, n, "\0\0\0\x0cjP  ", 8) || starts_with(d, n, "\xff\x4f\xff\x51", 4)) {
    return "a JPEG 2000";
  }
  if (n >= 12 && std::memcmp(d + 4, "ftyp", 4) == 0) return "an ISO media (HEIF, AVIF or MP4)";
  // TGA has no magic number: a colour-map flag of 0 or 1 and a known image type, which no
  // PNG, JPEG or BMP starts with.
  if (n >= 18 && d[1] <= 1 &&
      (d[2] == 1 || d[2] == 2 || d[2] == 3 || d[2] == 9 || d[2] == 10 || d[2] == 11)) {
    return "a TGA";
  }
  return nullptr;
}

std::string first_bytes(const uint8_t* d, size_t n) {
  std::string out;
  char hex[4];
  for (size_t i = 0; i < std::min<size_t>(n, 8); ++i) {
    std::snprintf(hex, sizeof(hex), i ? " %02x" : "%02x", d[i]);
    out += hex;
  }
  return out;
}

void check_pixels(const std::string& name, const char* format, uint64_t width, uint64_t height,
                  int64_t max_pixels) {
  EMBER_CHECK(width > 0 && height > 0, kOp, "'", name, "' is a ", format, " file with zero ",
              width == 0 ? "width" : "height", " (", width, "x", height, ")");
  const bool too_many = width > static_cast<uint64_t>(max_pixels) ||
                        height > static_cast<uint64_t>(max_pixels) / width;
  EMBER_CHECK(!too_many, kOp, "'", name, "' claims ", width, "x", height, " pixels (",
              grouped(width * height), "), more than max_pixels (", grouped(max_pixels),
              "); raise max_pixels to read it");
}

// Converts `n` pixels from `from` channels (1 L, 2 LA, 3 RGB, 4 RGBA) to `to` (1, 3 or 4) as
// PIL's Image.convert does: L = (19595 R + 38470 G + 7471 B + 2^15) >> 16, alpha dropped or
// set to 255, grey replicated.
void convert_channels(const uint8_t* src, int from, uint8_t* dst, int to, size_t n) {
  for (size_t i = 0; i < n; ++i, src += from, dst += to) {
    const bool grey = from <= 2;
    const uint8_t r = src[0], g = grey ? src[0] : src[1], b = grey ? src[0] : src[2];
    const uint8_t a = from == 2 ? src[1] : from == 4 ? src[3] : 255;
    if (to == 1) {
      dst[0] =
          grey ? r : static_cast<uint8_t>((r * 19595u + g * 38470u + b * 7471u + 0x8000u) >> 16);
    } else {
      dst[0] = r;
      dst[1] = g;
      dst[2] = b;
      if (to == 4) dst[3] = a;
    }
  }
}

// Gives the decoder a buffer for `native` channels and, when they differ from `wanted`,
// converts into the caller's buffer at the end.
class Output {
 public:
  Output(const std::string& name, const ImageAllocate& allocate, int wanted)
      : name_(name), allocate_(allocate), wanted_(wanted) {}
  uint8_t* buffer(int64_t height, int64_t width, int native) {
    height_ = height;
    width_ = width;
    native_ = native;
    const uint64_t bytes = static_cast<uint64_t>(height) * width * std::max(native, wanted_);
    try {
      if (native == wanted_) return final_ = allocate_(height, width, wanted_);
      // Uninitialised: the decoder writes every byte, and untouched pages cost nothing.
      scratch_.reset(new uint8_t[static_cast<size_t>(height * width * native)]);
      return scratch_.get();
    } catch (const std::bad_alloc&) {
      throw Error(ember::detail::str_cat(kOp, ": '", name_, "' (", width, "x", height, ") needs ",
                                         grouped(bytes),
                                         " bytes, more memory than could be allocated"));
    }
  }
  void finish() {
    if (native_ == wanted_) return;
    uint8_t* out = nullptr;
    try {
      out = allocate_(height_, width_, wanted_);
    } catch (const std::bad_alloc&) {
      throw Error(ember::detail::str_cat(kOp, ": '", name_, "' (", width_, "x", height_,
                                         "): out of memory for its pixels"));
    }
    convert_channels(scratch_.get(), native_, out, wanted_, static_cast<size_t>(height_ * width_));
  }

 private:
  const std::string& name_;
  const ImageAllocate& allocate_;
  int wanted_;
  int64_t height_ = 0, width_ = 0;
  int native_ = 0;
  uint8_t* final_ = nullptr;
  std::unique_ptr<uint8_t[]> scratch_;
};

// --- PNG ---------------------------------------------------------------------------------

struct PngState {
  const uint8_t* data = nullptr;
  size_t size = 0, pos = 0;
  png_structp png = nullptr;
  png_infop info = nullptr;
  char message[256] = {};
  char warning[256] = {};  // the last warning: libpng's reason for some errors
  bool truncated = false;
  int64_t max_pixels = 0;
  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, color_type = 0, channels = 0, passes = 1;
  uint8_t* pixels = nullptr;
  png_uint_32 row = 0;
  int pass = 0;
  bool ended = false;
};

void png_read_bytes(png_structp png, png_bytep out, size_t n) {
  auto* s = static_cast<PngState*>(png_get_io_ptr(png));
  if (n > s->size - s->pos) {
    s->truncated = true;
    png_error(png, "truncated");
  }
  std::memcpy(out, s->data + s->pos, n);
  s->pos += n;
}

void png_on_error(png_structp png, png_const_charp message) {
  auto* s = static_cast<PngState*>(png_get_error_ptr(png));
  std::snprintf(s->message, sizeof(s->message), "%s", message);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp png, png_const_charp message) {
  auto* s = static_cast<PngState*>(png_get_error_ptr(png));
  std::snprintf(s->warning, sizeof(s->warning), "%s", message);
}

// Reads the header; false on a libpng error.
bool png_header(PngState* s) {
  if (setjmp(png_jmpbuf(s->png))) return false;
  png_set_read_fn(s->png, s, png_read_bytes);
  png_read_info(s->png, s->info);
  int interlace = 0;
  png_get_IHDR(s->png, s->info, &s->width, &s->height, &s->bit_depth, &s->color_type, &interlace,
               nullptr, nullptr);
  return true;
}

// Sets up 8-bit output and reads every row into s->pixels, then the chunks after them.
bool png_pixels_setup(PngState* s) {
  if (setjmp(png_jmpbuf(s->png))) return false;
  png_set_strip_16(s->png);  // 16 bits: the high byte, as PIL
  png_set_packing(s->png);
  if (s->color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(s->png);
  if (s->color_type == PNG_COLOR_TYPE_GRAY && s->bit_depth < 8) {
    png_set_expand_gray_1_2_4_to_8(s->png);
  }
  if (png_get_valid(s->png, s->info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(s->png);
  s->passes = png_set_interlace_handling(s->png);
  png_read_update_info(s->png, s->info);
  s->channels = png_get_channels(s->png, s->info);
  if (png_get_rowbytes(s->png, s->info) != size_t{s->width} * s->channels) {
    png_error(s->png, "unexpected row size after conversion to 8 bits");
  }
  return true;
}

bool png_pixels_read(PngState* s) {
  if (setjmp(png_jmpbuf(s->png))) return false;
  const size_t row_bytes = size_t{s->width} * s->channels;
  for (s->pass = 0; s->pass < s->passes; ++s->pass) {
    for (s->row = 0; s->row < s->height; ++s->row) {
      png_read_row(s->png, s->pixels + s->row * row_bytes, nullptr);
    }
  }
  png_read_end(s->png, nullptr);
  s->ended = true;
  return true;
}

void decode_png(const uint8_t* data, size_t size, const std::string& name, int64_t max_pixels,
                Output& output) {
  PngState s;
  s.data = data;
  s.size = size;
  s.max_pixels = max_pixels;
  s.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &s, png_on_error, png_on_warning);
  EMBER_CHECK(s.png != nullptr, kOp, "libpng could not start reading '", name, "'");
  s.info = png_create_info_struct(s.png);
  struct Guard {
    PngState& s;
    ~Guard() { png_destroy_read_struct(&s.png, s.info ? &s.info : nullptr, nullptr); }
  } guard{s};
  EMBER_CHECK(s.info != nullptr, kOp, "libpng could not start reading '", name, "'");
  // libpng's own dimension limit must not stop an image that max_pixels allows.
  png_set_user_limits(s.png, 0x7fffffff, 0x7fffffff);
  const auto fail = [&](const char* where) {
    if (s.truncated) {
      throw Error(ember::detail::str_cat(kOp, ": '", name,
                                         "' is truncated: its PNG data ends at "
                                         "byte ",
                                         size, " (the end of the file) before ", where));
    }
    // "Invalid IHDR data" comes after a warning that says what is invalid.
    const bool explained = std::strstr(s.message, "Invalid") != nullptr && s.warning[0] != 0;
    throw Error(ember::detail::str_cat(
        kOp, ": '", name, "' is a corrupt PNG file (libpng: ", s.message, explained ? ": " : "",
        explained ? s.warning : "", ", at byte ", s.pos, " of ", size, ")"));
  };
  if (!png_header(&s)) fail("the end of its header chunks");
  check_pixels(name, "PNG", s.width, s.height, max_pixels);
  // Every pixel takes at least one bit of the inflated stream, which deflate makes at most
  // 1032 times larger than the file: a header claiming more pixels is refused before its
  // buffer is allocated.
  constexpr uint64_t kMaxPixelsPerByte = 1032 * 8;
  EMBER_CHECK(static_cast<uint64_t>(s.width) * s.height <= kMaxPixelsPerByte * size, kOp, "'", name,
              "' claims ", s.width, "x", s.height, " pixels, more than a PNG file of ",
              grouped(size), " bytes can hold (deflate expands at most 1032-fold)");
  if (!png_pixels_setup(&s)) fail("the end of its header chunks");
  s.pixels = output.buffer(s.height, s.width, s.channels);
  if (!png_pixels_read(&s)) {
    const std::string where =
        s.row < s.height && s.pass < s.passes
            ? ember::detail::str_cat("the image was complete (", s.row, " of ", s.height,
                                     " rows decoded", s.passes > 1 ? " in interlace pass " : "",
                                     s.passes > 1 ? std::to_string(s.pass + 1) : "", ")")
            : "its IEND chunk";
    fail(where.c_str());
  }
  output.finish();
}

// --- JPEG --------------------------------------------------------------------------------

struct JpegState {
  jpeg_decompress_struct cinfo{};
  jpeg_error_mgr err{};
  jpeg_progress_mgr progress{};
  std::jmp_buf jump{};
  char message[JMSG_LENGTH_MAX + 64] = {};
  bool created = false, truncated = false;
  uint8_t* pixels = nullptr;
  JDIMENSION row = 0;
  size_t row_bytes = 0;
};

// libjpeg warns, and goes on with made-up data, for these: ember refuses the file instead.
bool corrupts_pixels(int code) {
  switch (code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_MUST_RESYNC:
    case JWRN_NOT_SEQUENTIAL:
    case JWRN_TOO_MUCH_DATA:
    case JWRN_BOGUS_PROGRESSION:
    case JWRN_ARITH_BAD_CODE:
      return true;
    default:
      return false;
  }
}

void jpeg_on_error(j_common_ptr cinfo) {
  auto* s = reinterpret_cast<JpegState*>(cinfo->client_data);
  (*cinfo->err->format_message)(cinfo, s->message);
  std::longjmp(s->jump, 1);
}

void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level >= 0 || !corrupts_pixels(cinfo->err->msg_code)) return;  // traces, benign warnings
  auto* s = reinterpret_cast<JpegState*>(cinfo->client_data);
  s->truncated = cinfo->err->msg_code == JWRN_JPEG_EOF;
  (*cinfo->err->format_message)(cinfo, s->message);
  std::longjmp(s->jump, 1);
}

// A progressive JPEG of many tiny scans costs a pass over the image per scan.
constexpr int kMaxJpegScans = 1000;

void jpeg_on_progress(j_common_ptr cinfo) {
  auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (d->input_scan_number > kMaxJpegScans) {
    auto* s = reinterpret_cast<JpegState*>(cinfo->client_data);
    std::snprintf(s->message, sizeof(s->message), "more than %d progressive scans", kMaxJpegScans);
    std::longjmp(s->jump, 1);
  }
}

bool jpeg_header(JpegState* s, const uint8_t* data, size_t size) {
  if (setjmp(s->jump)) return false;
  jpeg_create_decompress(&s->cinfo);
  s->created = true;
  s->cinfo.client_data = s;
  s->cinfo.progress = &s->progress;
  jpeg_mem_src(&s->cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&s->cinfo, TRUE);
  return true;
}

bool jpeg_start(JpegState* s) {
  if (setjmp(s->jump)) return false;
  jpeg_start_decompress(&s->cinfo);
  return true;
}

bool jpeg_pixels(JpegState* s) {
  if (setjmp(s->jump)) return false;
  while (s->cinfo.output_scanline < s->cinfo.output_height) {
    s->row = s->cinfo.output_scanline;
    JSAMPROW rows[1] = {s->pixels + size_t{s->row} * s->row_bytes};
    jpeg_read_scanlines(&s->cinfo, rows, 1);
  }
  s->row = s->cinfo.output_height;
  jpeg_finish_decompress(&s->cinfo);
  return true;
}

void decode_jpeg(const uint8_t* data, size_t size, const std::string& name, int64_t max_pixels,
                 Output& output) {
  auto s = std::make_unique<JpegState>();
  s->cinfo.err = jpeg_std_error(&s->err);
  s->err.error_exit = jpeg_on_error;
  s->err.emit_message = jpeg_on_message;
  s->cinfo.client_data = s.get();
  s->progress.progress_monitor = jpeg_on_progress;
  struct Guard {
    JpegState& s;
    ~Guard() {
      if (s.created) jpeg_destroy_decompress(&s.cinfo);
    }
  } guard{*s};
  const auto fail = [&](const std::string& where) {
    if (s->truncated) {
      throw Error(ember::detail::str_cat(kOp, ": '", name,
                                         "' is truncated: its JPEG data ends at "
                                         "byte ",
                                         size, " (the end of the file) before ", where,
                                         " (libjpeg: ", s->message, ")"));
    }
    throw Error(ember::detail::str_cat(kOp, ": '", name,
                                       "' is a corrupt JPEG file (libjpeg: ", s->message, ")"));
  };
  if (!jpeg_header(s.get(), data, size)) fail("the end of its header");
  const J_COLOR_SPACE space = s->cinfo.jpeg_color_space;
  EMBER_CHECK(space == JCS_GRAYSCALE || space == JCS_YCbCr || space == JCS_RGB, kOp, "'", name,
              "' is a ", space == JCS_CMYK || space == JCS_YCCK ? "CMYK" : "multi-channel",
              " JPEG file (", s->cinfo.num_components,
              " components); ember reads grey and colour (YCbCr or RGB) JPEGs");
  check_pixels(name, "JPEG", s->cinfo.image_width, s->cinfo.image_height, max_pixels);
  s->cinfo.out_color_space = space == JCS_GRAYSCALE ? JCS_GRAYSCALE : JCS_RGB;
  if (!jpeg_start(s.get())) fail("its image data");
  const int native = s->cinfo.output_components;
  s->row_bytes = size_t{s->cinfo.output_width} * native;
  s->pixels = output.buffer(s->cinfo.output_height, s->cinfo.output_width, native);
  if (!jpeg_pixels(s.get())) {
    fail(
        s->row < s->cinfo.output_height
            ? ember::detail::str_cat("row ", s->row, " of ", s->cinfo.output_height, " was decoded")
            : std::string("its end-of-image marker"));
  }
  output.finish();
}

// --- BMP ---------------------------------------------------------------------------------

uint32_t le32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}
uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// The byte a mask selects (0-3), or -1 for a mask that is not one whole byte.
int mask_byte(uint32_t mask) {
  for (int k = 0; k < 4; ++k) {
    if (mask == 0xffu << (8 * k)) return k;
  }
  return -1;
}

void decode_bmp(const uint8_t* d, size_t size, const std::string& name, int64_t max_pixels,
                Output& output) {
  const auto bad = [&](const std::string& why) {
    throw Error(
        ember::detail::str_cat(kOp, ": '", name, "' is a BMP file ember cannot read: ", why));
  };
  const auto truncated = [&](uint64_t needed, const std::string& what) {
    throw Error(ember::detail::str_cat(kOp, ": '", name, "' is truncated at byte ", size, " of ",
                                       needed, ": ", what));
  };
  if (size < 18) truncated(18, "the BMP file header is incomplete");
  const uint32_t offset = le32(d + 10), header = le32(d + 14);
  if (header == 12) bad("its OS/2 header (12 bytes) is not supported");
  if (header != 40 && header != 52 && header != 56 && header != 108 && header != 124) {
    bad(ember::detail::str_cat("its info header has an unknown size, ", header, " bytes"));
  }
  if (size < 14 + uint64_t{header}) truncated(14 + uint64_t{header}, "the BMP info header");
  const int32_t width = static_cast<int32_t>(le32(d + 18));
  const int32_t signed_height = static_cast<int32_t>(le32(d + 22));
  const uint16_t planes = le16(d + 26), bits = le16(d + 28);
  const uint32_t compression = le32(d + 30), colors_used = le32(d + 46);
  if (planes != 1) bad(ember::detail::str_cat("its header says ", planes, " planes, not 1"));
  if (width < 0 || signed_height == INT32_MIN) {
    bad(ember::detail::str_cat("its header claims ", width, "x", signed_height, " pixels"));
  }
  const bool top_down = signed_height < 0;
  const uint64_t w = static_cast<uint64_t>(width);
  const uint64_t h = top_down ? static_cast<uint64_t>(-static_cast<int64_t>(signed_height))
                              : static_cast<uint64_t>(signed_height);
  check_pixels(name, "BMP", w, h, max_pixels);
  if (bits != 8 && bits != 24 && bits != 32) {
    bad(ember::detail::str_cat(bits, "-bit pixels are not supported (8, 24 and 32 are)"));
  }
  // Where each channel is in a 32-bit pixel: B, G, R (and no alpha) unless masks say otherwise.
  int at[4] = {2, 1, 0, -1};
  if (compression == 3 && bits == 32) {  // BI_BITFIELDS
    const uint64_t masks_end = 14 + uint64_t{header} + (header == 40 ? 12 : 0);
    if (size < masks_end) truncated(masks_end, "the BMP colour masks");
    const uint8_t* m = d + 54;
    for (int c = 0; c < 3; ++c) {
      at[c] = mask_byte(le32(m + 4 * c));
      if (at[c] < 0) {
        bad(ember::detail::str_cat("colour mask ", le32(m + 4 * c), " is not one whole byte"));
      }
    }
    const uint32_t alpha = header >= 56 ? le32(m + 12) : 0;
    if (alpha != 0) {
      at[3] = mask_byte(alpha);
      if (at[3] < 0) bad(ember::detail::str_cat("alpha mask ", alpha, " is not one whole byte"));
    }
  } else if (compression != 0) {
    static const char* const kKinds[] = {"uncompressed", "RLE8", "RLE4",
                                         "bit-field",    "JPEG", "PNG"};
    bad(ember::detail::str_cat(compression < 6 ? kKinds[compression] : "unknown", " compression (",
                               compression, ") of ", bits,
                               "-bit pixels is not supported (uncompressed is)"));
  }
  uint8_t palette[256][3] = {};
  uint32_t palette_size = 0;
  if (bits == 8) {
    palette_size = colors_used == 0 ? 256 : colors_used;
    if (palette_size > 256) {
      bad(ember::detail::str_cat("its palette claims ", colors_used, " colours, more than 256"));
    }
    const uint64_t start = 14 + uint64_t{header} + (compression == 3 ? 12 : 0);
    const uint64_t end = start + 4 * uint64_t{palette_size};
    if (end > offset) {
      bad(ember::detail::str_cat("its palette (", palette_size, " colours, bytes ", start, "-", end,
                                 ") overlaps the pixels at byte ", offset));
    }
    if (size < end) truncated(end, "the BMP palette");
    for (uint32_t i = 0; i < palette_size; ++i) {
      palette[i][0] = d[start + 4 * i + 2];
      palette[i][1] = d[start + 4 * i + 1];
      palette[i][2] = d[start + 4 * i];
    }
  }
  if (offset < 14 + uint64_t{header}) {
    bad(ember::detail::str_cat("its pixel data starts at byte ", offset, ", inside its header"));
  }
  const uint64_t row_bytes = (w * bits + 31) / 32 * 4;
  // Rows past what any file can hold are truncated whatever the exact figure.
  const bool huge = row_bytes > (uint64_t{1} << 62) / h;
  const uint64_t needed = huge ? UINT64_MAX : offset + row_bytes * (h - 1) + (w * bits + 7) / 8;
  if (size < needed) {
    truncated(needed, ember::detail::str_cat("its header promises ", w, "x", h, " pixels of ", bits,
                                             " bits from byte ", offset));
  }
  const int channels = at[3] >= 0 ? 4 : 3;
  uint8_t* out = output.buffer(static_cast<int64_t>(h), static_cast<int64_t>(w), channels);
  const size_t pixel_bytes = bits / 8;
  for (uint64_t y = 0; y < h; ++y) {
    const uint8_t* row = d + offset + row_bytes * (top_down ? y : h - 1 - y);
    uint8_t* o = out + y * w * channels;
    for (uint64_t x = 0; x < w; ++x, o += channels) {
      const uint8_t* p = row + x * pixel_bytes;
      if (bits == 8) {
        if (*p >= palette_size) {
          bad(ember::detail::str_cat("pixel (", x, ", ", y, ") uses colour ", int{*p},
                                     " of a palette of ", palette_size));
        }
        std::memcpy(o, palette[*p], 3);
      } else {
        for (int c = 0; c < channels; ++c) o[c] = p[at[c]];
      }
    }
  }
  output.finish();
}

}  // namespace

void decode_image_bytes(const uint8_t* data, size_t size, const std::string& name, int channels,
                        int64_t max_pixels, const ImageAllocate& allocate) {
  EMBER_CHECK(channels == 1 || channels == 3 || channels == 4, kOp,
              "channels must be 1, 3 or 4, got ", channels);
  EMBER_CHECK(max_pixels > 0, kOp, "max_pixels must be positive, got ", max_pixels);
  EMBER_CHECK(size > 0, kOp, "'", name, "' is empty (0 bytes); ", kFormats);
  Output output(name, allocate, channels);
  static const char kPngSignature[] = "\x89PNG\r\n\x1a\n";
  EMBER_CHECK(size >= 8 || std::memcmp(data, kPngSignature, size) != 0, kOp, "'", name,
              "' is truncated at byte ", size, " of the 8-byte PNG signature");
  if (starts_with(data, size, "\x89PNG\r\n\x1a\n", 8)) {
    decode_png(data, size, name, max_pixels, output);
  } else if (starts_with(data, size, "\xff\xd8\xff", 3)) {
    decode_jpeg(data, size, name, max_pixels, output);
  } else if (starts_with(data, size, "BM", 2)) {
    decode_bmp(data, size, name, max_pixels, output);
  } else if (const char* format = other_format(data, size)) {
    throw Error(ember::detail::str_cat(kOp, ": '", name, "' is ", format, " file; ", kFormats));
  } else {
    throw Error(ember::detail::str_cat(kOp, ": '", name,
                                       "' is not a PNG, JPEG or BMP file (it starts with bytes ",
                                       first_bytes(data, size), "); ", kFormats));
  }
}

}  // namespace ember::data::detail
