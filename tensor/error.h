// Errors: ember::Error for user mistakes, EMBER_ASSERT for ember's own invariants.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace ember {

// A user mistake (bad shape, wrong device, corrupt file, ...). The message names the
// operation and the offending values, e.g. "add: shapes [2, 3] and [4] cannot broadcast".
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A broken internal invariant: a bug in ember, never the caller's fault.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& message) : std::logic_error(message) {}
};

namespace detail {
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
[[noreturn]] void throw_internal(const char* file, int line, const char* condition,
                                 const std::string& message);
}  // namespace detail

}  // namespace ember

// Throws ember::Error("<op>: <message parts...>") when `cond` is false.
#define EMBER_CHECK(cond, op, ...)                                           \
  do {                                                                       \
    if (!(cond)) [[unlikely]] {                                              \
      throw ::ember::Error(::ember::detail::str_cat(op, ": ", __VA_ARGS__)); \
    }                                                                        \
  } while (0)

// Checks an internal invariant; a failure is a bug in ember and throws InternalError.
#define EMBER_ASSERT(cond, ...)                                                                 \
  do {                                                                                          \
    if (!(cond)) [[unlikely]] {                                                                 \
      ::ember::detail::throw_internal(__FILE__, __LINE__, #cond,                                \
                                      ::ember::detail::str_cat("" __VA_OPT__(, ) __VA_ARGS__)); \
    }                                                                                           \
  } while (0)
