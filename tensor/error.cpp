#include "error.h"

namespace ember::detail {

void throw_internal(const char* file, int line, const char* condition, const std::string& message) {
  throw InternalError(str_cat("ember internal error at ", file, ":", line, ": ", condition,
                              message.empty() ? "" : " (", message, message.empty() ? "" : ")",
                              " -- please report this bug"));
}

}  // namespace ember::detail
