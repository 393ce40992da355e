// Blocking-socket helpers shared by the TCP store and the TCP process group's bootstrap.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstddef>

namespace ember::dist::detail {

// Closes the socket it holds, if any, when it goes out of scope.
struct FdGuard {
  int fd = -1;
  ~FdGuard();
};

// Writes all `n` bytes, retrying after signals and never raising SIGPIPE; false when the
// connection is gone.
bool write_all(int fd, const void* data, size_t n);

// Waits until `fd` is readable (or closed); false once `deadline` passes. Signals that
// interrupt the wait do not end it early.
bool wait_readable(int fd, std::chrono::steady_clock::time_point deadline);

// connect() that gives up at `deadline` rather than after the kernel's own limit (minutes, for
// a host that does not answer); false with errno set on failure. The socket stays blocking.
bool connect_by(int fd, const sockaddr* address, socklen_t length,
                std::chrono::steady_clock::time_point deadline);

// The port a bound socket of either address family listens on.
int bound_port(int fd);

}  // namespace ember::dist::detail
