#include <ember/config.h>
#include <ember/version.h>

namespace ember {

std::string_view version() noexcept { return EMBER_VERSION; }

}  // namespace ember
