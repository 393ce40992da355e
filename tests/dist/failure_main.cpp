// Not a gtest: a job that is meant to fail, run by expect_failure.sh with 2 ranks, under
// mpirun (backend mpi, the default) or torchrun_style.sh (backend tcp).
//   failure_main skip|exit|queued|unwaited|local|caught|unwound|save_alone|other_op|
//                other_count|skip_next|leave [mpi|tcp]
//   skip: rank 1 skips the second allreduce; rank 0 must raise ember::Error within the
//         group's 2 s timeout, and the job must end non-zero instead of hanging.
//   exit: rank 1 dies after the first allreduce; the job must end non-zero, promptly.
//   queued: as skip, but rank 0 has more collectives queued behind the one that hangs:
//         once a wait times out and breaks the group, those fail at once ("failed at once"),
//         although the communication thread is still stuck in MPI.
//   unwaited: as skip, but nobody waits on rank 0's allreduce #2: destroying the group must
//         end the job once the timeout passed ("timed out after"), not hang in its join.
//   local: (mpi) rank 0 sends 8 elements where rank 1 receives 4, so MPI fails the receive on
//         rank 1 alone; after an MPI error its group is broken, and its next collective is
//         refused at once ("rank 1: refused: ...").
//   caught: the user's way: init_process_group() inside a try, whose catch prints the error;
//         rank 0 never joins barrier #1, so rank 1's times out after 3 s. Its message must
//         reach stderr although the broken group then ends the job.
//   unwound: as caught, but the group is an object declared inside the try: it is destroyed
//         while the exception unwinds (under MPI its destructor ends the job with MPI_Abort
//         before the catch runs), and still the message must reach stderr.
//   save_alone: the tutorial's guard around a collective save: rank 0 calls
//         save_checkpoint(path, ck, group) alone while rank 1 goes on to its next allreduce.
//         Both ranks fail at once, each naming both calls. Each rank prints
//         "rank R: failed within|after 5 s (T s): MESSAGE".
//   other_op, other_count, skip_next, leave: at 2 or 3 ranks, after allreduce #1 the last
//         rank differs from the others, who all-reduce 1024 floats as allreduce #2, then
//         issue a barrier: it broadcasts instead (other_op), all-reduces 512 floats
//         (other_count), skips to the barrier (skip_next), or leaves the group, as the DDP
//         tutorial's last epoch does where rank 0 alone saves a checkpoint (leave: the others
//         call save_checkpoint(path, ck, group) while the last rank calls
//         destroy_process_group() and lives on for 3 s; leave_exit: it returns from main and
//         the default group goes at exit; leave_unwind: its group's last owner is destroyed
//         while the program's own exception unwinds). Every rank that waits fails at once,
//         naming the ranks, the numbers and the calls, and prints as save_alone does.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include <ember/dist/checkpoint.h>
#include <ember/dist/dist.h>
#include <ember/nn/layers.h>
#include <ember/tensor/ops.h>

namespace {

// Runs `call`, which must throw ember::Error, and prints how long it took and what it said.
template <typename F>
int expect_error(int rank, F&& call) {
  const auto start = std::chrono::steady_clock::now();
  try {
    call();
    std::fprintf(stderr, "rank %d: the call unexpectedly completed\n", rank);
    return 0;
  } catch (const ember::Error& e) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "rank %d: failed %s 5 s (%.2f s): %s\n", rank,
                 seconds < 5 ? "within" : "after", seconds, e.what());
    return 1;
  }
}

// save_alone: each rank reports how long its failing call took and what it said.
int save_alone(const std::string& backend) {
  using namespace std::chrono_literals;
  namespace dist = ember::dist;
  dist::InitOptions options;
  options.device = ember::kCPU;
  options.backend = backend;
  options.group.timeout = 10s;
  auto pg = dist::init_process_group(options);
  ember::Tensor t = ember::ones({1024});
  pg->allreduce(t)->wait();
  auto model = std::make_shared<ember::nn::Linear>(3, 2);
  dist::Checkpoint ck;
  ck.model = model.get();
  ck.generators = {{"default", &ember::default_generator()}};
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("ember_save_alone_" + std::to_string(::getpid()) + ".safetensors"))
                               .string();
  const int status = expect_error(pg->rank(), [&] {
    if (pg->rank() == 0) {
      dist::save_checkpoint(path, ck, pg.get());  // rank 1 never calls it
    } else {
      pg->allreduce(t)->wait();  // allreduce #2
    }
  });
  std::filesystem::remove(path);
  return status;
}

// other_op, other_count, skip_next, leave: the last rank differs at collective #2.
int odd_one_out(const std::string& mode, const std::string& backend) {
  using namespace std::chrono_literals;
  namespace dist = ember::dist;
  dist::InitOptions options;
  options.device = ember::kCPU;
  options.backend = backend;
  options.group.timeout = 60s;  // a failure that waits for it shows as "after 5 s"
  auto pg = dist::init_process_group(options);
  ember::Tensor t = ember::ones({1024});
  pg->allreduce(t)->wait();
  const int rank = pg->rank();
  const bool odd = rank == pg->size() - 1;
  if (mode.starts_with("leave")) {
    if (odd && mode == "leave_exit") {
      std::fprintf(stderr, "rank %d: returns from main\n", rank);
      return 0;  // the default group goes at exit
    }
    if (odd && mode == "leave_unwind") {
      try {
        const auto last = std::move(pg);  // the group's last owner, inside the try
        dist::destroy_process_group();
        throw std::runtime_error("the user's own error");
      } catch (const std::runtime_error& e) {  // the group was destroyed while it unwound
        std::fprintf(stderr, "rank %d: caught %s\n", rank, e.what());
      }
      std::this_thread::sleep_for(3s);
      return 0;
    }
    if (odd) {
      pg.reset();
      dist::destroy_process_group();
      std::fprintf(stderr, "rank %d: left the group\n", rank);
      std::this_thread::sleep_for(3s);  // lives on, writing its logs
      return 0;
    }
    auto model = std::make_shared<ember::nn::Linear>(3, 2);
    dist::Checkpoint ck;
    ck.model = model.get();
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("ember_leave_" + std::to_string(::getpid()) + ".safetensors"))
                                 .string();
    const int status = expect_error(rank, [&] { dist::save_checkpoint(path, ck, pg.get()); });
    std::filesystem::remove(path);
    return status;
  }
  return expect_error(rank, [&] {
    if (!odd) {
      pg->allreduce(t)->wait();
      pg->barrier()->wait();
    } else if (mode == "other_op") {
      pg->broadcast(t, 0)->wait();
    } else if (mode == "skip_next") {
      pg->barrier()->wait();
    } else {
      pg->allreduce(ember::ones({512}))->wait();
    }
  });
}

// caught / unwound: rank 1's barrier #1 times out inside a try, as a user writes it.
int lost_error(const std::string& mode, const std::string& backend) {
  using namespace std::chrono_literals;
  namespace dist = ember::dist;
  const bool default_group = mode == "caught";
  const dist::LaunchEnv launch = dist::read_launch_env();
  try {
    dist::ProcessGroupOptions options;
    options.timeout = 3000ms;
    std::shared_ptr<dist::ProcessGroup> pg;
    if (default_group) {
      dist::InitOptions init;
      init.device = ember::kCPU;
      init.backend = backend;
      init.group = options;
      pg = dist::init_process_group(init);
    } else if (backend == "mpi") {
      pg = std::make_shared<dist::MpiProcessGroup>(options);
    } else {
      pg = std::make_shared<dist::TcpProcessGroup>(launch.master_addr, launch.master_port,
                                                   launch.rank, launch.world_size,
                                                   launch.local_rank, options);
    }
    if (pg->rank() == 0) {
      std::this_thread::sleep_for(60s);  // skips the barrier; the launcher ends us before this
      return 0;
    }
    if (default_group) {
      dist::barrier();
    } else {
      pg->barrier()->wait();
    }
    std::fprintf(stderr, "rank 1: barrier #1 unexpectedly completed\n");
    return 0;
  } catch (const ember::Error& e) {
    std::fprintf(stderr, "rank %d: caught: %s\n", launch.rank, e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  const std::string mode = argc > 1 ? argv[1] : "skip";
  const std::string backend = argc > 2 ? argv[2] : "mpi";
  if (mode == "caught" || mode == "unwound") return lost_error(mode, backend);
  if (mode == "save_alone") return save_alone(backend);
  if (mode == "other_op" || mode == "other_count" || mode == "skip_next" ||
      mode.starts_with("leave")) {
    return odd_one_out(mode, backend);
  }
  ember::dist::InitOptions options;
  options.device = ember::kCPU;
  options.backend = backend;
  options.group.timeout = 2000ms;
  auto pg = ember::dist::init_process_group(options);
  ember::Tensor t = ember::ones({1024});
  pg->allreduce(t)->wait();
  std::fprintf(stderr, "rank %d: allreduce #1 done (%g)\n", pg->rank(), t.sum().item<double>());
  if (mode == "local") {
    if (pg->rank() == 0) {
      pg->send(ember::ones({8}), 1, /*tag=*/7)->wait();
      pg->allreduce(t)->wait();  // rank 1 refuses it: times out, and ends the job
      return 0;
    }
    try {
      pg->recv(ember::zeros({4}), 0, /*tag=*/7)->wait();
      std::fprintf(stderr, "rank 1: the truncated receive unexpectedly completed\n");
    } catch (const ember::Error& e) {
      std::fprintf(stderr, "rank 1: %s\n", e.what());
    }
    try {
      pg->allreduce(t)->wait();
      std::fprintf(stderr, "rank 1: allreduce #2 unexpectedly ran\n");
    } catch (const ember::Error& e) {
      std::fprintf(stderr, "rank 1: refused: %s\n", e.what());
    }
    return 0;  // destroying the broken group ends the job non-zero
  }
  if (pg->rank() == 1) {
    if (mode == "exit") std::_Exit(3);
    std::this_thread::sleep_for(60s);  // skipped allreduce #2; the launcher ends us before this
    return 0;
  }
  if (mode == "unwaited") {
    const ember::dist::WorkHandle stuck = pg->allreduce(t);  // rank 1 never joins it
    return 0;  // the group is destroyed with allreduce #2 still running
  }
  if (mode == "queued") {
    ember::Tensor u = ember::ones({16});
    const ember::dist::WorkHandle stuck = pg->allreduce(t);  // rank 1 never joins it
    const ember::dist::WorkHandle behind = pg->allreduce(u);
    const ember::dist::WorkHandle last = pg->barrier();
    try {
      behind->wait();
    } catch (const ember::Error& e) {
      std::fprintf(stderr, "rank 0: %s\n", e.what());
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      last->wait();
    } catch (const ember::Error& e) {
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "rank 0: the queued barrier failed after %.2f s: %s\n", seconds,
                   e.what());
      if (seconds < 1.0) std::fprintf(stderr, "rank 0: failed at once\n");
    }
    return 0;  // destroying the broken group ends the job non-zero
  }
  pg->allreduce(t)->wait();  // throws; left uncaught it ends the process
  std::fprintf(stderr, "rank 0: allreduce #2 unexpectedly completed\n");
  return 0;
}
