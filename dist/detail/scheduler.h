// The machinery the queued backends (MPI, TCP) share around their transports: for now the
// group's broken state and its messages.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <string>

#include "common.h"

namespace ember::dist::detail {

// Whether a group can still be used. Any failure of an issued operation but a debug-mode
// mismatch (which every rank sees) breaks it for good: the reason is recorded, written to
// stderr once (report_broken_group), and every later operation is refused with it.
class GroupHealth {
 public:
  // `backend` names the group in messages ("mpi", "tcp"); it must outlive the health.
  void init(const char* backend, int rank, int size) {
    backend_ = backend;
    rank_ = rank;
    size_ = size;
  }
  bool broken() const { return broken_.load(); }
  const char* backend() const { return backend_; }
  // Why it broke. Read only once broken() is true: it is written before the flag is raised.
  const std::string& reason() const { return reason_; }

  // Records `message` as the reason and reports it, unless the group broke already; true
  // when this call broke it. Callers serialise it (the group's mutex).
  bool mark_broken(const std::string& message) {
    if (broken_.load()) return false;
    reason_ = message;
    broken_.store(true);
    report_broken_group(backend_, rank_, message);
    return true;
  }
  // The same without the report, for a process about to end with its own message.
  void mark_broken_quietly(const std::string& message) {
    reason_ = message;
    broken_.store(true);
  }

  // "allreduce #17 on rank 1 timed out after 5000 ms (mpi group of 2 ranks): ...".
  std::string timeout_message(const std::string& what, std::chrono::milliseconds limit) const {
    return detail::timeout_message(what, rank_, limit, backend_, size_);
  }

  // The failure `e` of an issued operation as its waiter gets it. Unless every rank skips the
  // operation (a debug-mode mismatch), it breaks the group first, through `break_group`.
  template <typename BreakGroup>
  static std::string failure_of(const std::exception& e, BreakGroup&& break_group) {
    if (dynamic_cast<const FingerprintMismatch*>(&e) == nullptr) break_group(e.what());
    return e.what();
  }

 private:
  std::atomic<bool> broken_{false};
  std::string reason_;
  const char* backend_ = "";
  int rank_ = 0, size_ = 1;
};

}  // namespace ember::dist::detail
