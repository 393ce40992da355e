// dist::spawn: torch.multiprocessing.spawn for ember. Starts `nprocs` worker processes of this
// program, runs fn(rank) in each, joins them and returns what each returned, by rank:
//
//   auto sums = ember::dist::spawn(2, [](int rank) {
//     ember::dist::init_process_group();            // TCP on the CPU, one GPU each on CUDA
//     auto t = ember::full({2}, rank + 1.0f);
//     ember::dist::all_reduce(t);
//     ember::dist::destroy_process_group();
//     return t.to_vector<float>();                  // {3, 3} from every rank
//   });
//
// Each worker finds RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE (= nprocs), MASTER_ADDR and
// MASTER_PORT set (a free port), so init_process_group() needs no arguments, and, unless this
// process already has one, a fresh job secret (EMBER_JOB_SECRET_FILE, see detail/auth.h).
//
// If a worker fails (fn throws, the process exits non-zero or is killed by a signal) the others
// are stopped (SIGTERM, SIGKILL after `grace`) and spawn throws ember::Error naming the rank and
// its error: "spawn: rank 1 of 3 failed: <the exception's message>".
//
// How workers start (PyTorch's "spawn" start method, not "fork"): each worker runs this
// program again from the start, with the same command line, and becomes a worker when it
// reaches the same spawn() call (counted in call order). So call spawn from main() on a path
// that does the same when run again, as Python asks of `if __name__ == "__main__"`; what main
// does before the call runs in every worker too. A fresh process (rather than fork()) is what
// makes spawn safe after threads, OpenMP, MPI, OpenSSL or CUDA have started in this process.
// fn runs in the worker, so it may capture anything main() computed before the call (captures
// are rebuilt there by the same code, not copied).
//
// fn's return type: void, std::string, an arithmetic type, or a std::vector of an arithmetic
// type (return t.to_vector<float>() for a tensor); spawn returns std::vector of it, one per
// rank (nothing for void). A worker ends (std::exit) right after fn returns.
//
// Workers write to this process's stdout and stderr. They die with the thread that called
// spawn (PR_SET_PDEATHSIG), so a parent killed by SIGKILL leaves none behind; call spawn from
// one thread at a time. ember-run (apps/ember_run.cpp) starts workers the same way
// (dist/detail/supervisor.h) for programs started from the command line.
#pragma once

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include <ember/tensor/error.h>

namespace ember::dist {

struct SpawnOptions {
  // Where rank 0 serves the workers' store (MASTER_ADDR); the port is a free one unless set.
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // How long stopped workers get between SIGTERM and SIGKILL.
  std::chrono::milliseconds grace = std::chrono::seconds(5);
  // The whole job's limit: past it the workers are stopped and spawn throws. 0: none.
  std::chrono::milliseconds timeout = std::chrono::milliseconds(0);
};

namespace detail {

// The untyped spawn: fn(rank)'s bytes from every rank. In a worker it does not return.
std::vector<std::string> spawn_bytes(int nprocs, const std::function<std::string(int)>& fn,
                                     const SpawnOptions& options);

template <class T>
std::string encode_result(const T& value) {
  if constexpr (std::is_same_v<T, std::string>) {
    return value;
  } else if constexpr (std::is_arithmetic_v<T>) {
    return std::string(reinterpret_cast<const char*>(&value), sizeof(T));
  } else {
    static_assert(std::is_arithmetic_v<typename T::value_type> &&
                      std::is_same_v<T, std::vector<typename T::value_type>>,
                  "dist::spawn: fn must return void, std::string, an arithmetic type or a "
                  "std::vector of one");
    return std::string(reinterpret_cast<const char*>(value.data()),
                       value.size() * sizeof(typename T::value_type));
  }
}

template <class T>
T decode_result(const std::string& bytes, int rank) {
  if constexpr (std::is_same_v<T, std::string>) {
    return bytes;
  } else if constexpr (std::is_arithmetic_v<T>) {
    EMBER_CHECK(bytes.size() == sizeof(T), "spawn", "rank ", rank, " returned ", bytes.size(),
                " bytes for a value of ", sizeof(T));
    T value{};
    std::memcpy(&value, bytes.data(), sizeof(T));
    return value;
  } else {
    using V = typename T::value_type;
    EMBER_CHECK(bytes.size() % sizeof(V) == 0, "spawn", "rank ", rank, " returned ", bytes.size(),
                " bytes, not a whole number of ", sizeof(V), "-byte elements");
    T out(bytes.size() / sizeof(V));
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }
}

}  // namespace detail

// Runs fn(rank) in `nprocs` worker processes (see above); returns their results by rank.
template <class Fn>
auto spawn(int nprocs, Fn&& fn, const SpawnOptions& options = {}) {
  using R = std::decay_t<std::invoke_result_t<Fn&, int>>;
  if constexpr (std::is_void_v<R>) {
    detail::spawn_bytes(
        nprocs,
        [&fn](int rank) {
          fn(rank);
          return std::string();
        },
        options);
  } else {
    const std::vector<std::string> bytes = detail::spawn_bytes(
        nprocs, [&fn](int rank) { return detail::encode_result<R>(fn(rank)); }, options);
    std::vector<R> out;
    out.reserve(bytes.size());
    for (size_t r = 0; r < bytes.size(); ++r) {
      out.push_back(detail::decode_result<R>(bytes[r], static_cast<int>(r)));
    }
    return out;
  }
}

}  // namespace ember::dist
