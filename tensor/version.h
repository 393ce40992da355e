// ember's version, as the library reports it at run time.
#pragma once

#include <string_view>

namespace ember {

// "MAJOR.MINOR.PATCH" of the ember libraries this program runs against (CMake's
// project(VERSION)); EMBER_VERSION in <ember/config.h> is the version it was compiled against.
std::string_view version() noexcept;

}  // namespace ember
