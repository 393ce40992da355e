#include "device.h"

#include <charconv>

#include "error.h"

namespace ember {

Device::Device(std::string_view spec) {
  if (spec == "cpu") {
    type = DeviceType::kCPU;
    index = 0;
    return;
  }
  if (spec.starts_with("cuda")) {
    type = DeviceType::kCUDA;
    index = 0;
    const std::string_view rest = spec.substr(4);
    if (rest.empty()) return;
    if (rest.size() > 1 && rest[0] == ':') {
      const char* first = rest.data() + 1;
      const char* last = rest.data() + rest.size();
      auto [end, ec] = std::from_chars(first, last, index);
      if (ec == std::errc() && end == last && index >= 0) return;
    }
  }
  throw Error(detail::str_cat("Device: cannot parse \"", spec,
                              "\" (expected \"cpu\", \"cuda\" or \"cuda:N\")"));
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

std::ostream& operator<<(std::ostream& out, Device d) { return out << d.str(); }

}  // namespace ember
