#include "version.h"

#include <ember/config.h>

namespace ember {

std::string_view version() noexcept { return EMBER_VERSION; }

}  // namespace ember
