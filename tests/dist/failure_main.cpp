// Not a gtest: a job that is meant to fail, run by expect_failure.sh with 2 ranks, under
// mpirun (backend mpi, the default) or torchrun_style.sh (backend tcp).
//   failure_main skip|exit [mpi|tcp]
//   skip: rank 1 skips the second allreduce; rank 0 must raise ember::Error within the
//         group's 2 s timeout, and the job must end non-zero instead of hanging.
//   exit: rank 1 dies after the first allreduce; the job must end non-zero, promptly.
#include <cstdio>
#include <cstring>
#include <thread>

#include <ember/dist/dist.h>
#include <ember/tensor/ops.h>

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  const std::string mode = argc > 1 ? argv[1] : "skip";
  ember::dist::InitOptions options;
  options.device = ember::kCPU;
  options.backend = argc > 2 ? argv[2] : "mpi";
  options.group.timeout = 2000ms;
  auto pg = ember::dist::init_process_group(options);
  ember::Tensor t = ember::ones({1024});
  pg->allreduce(t)->wait();
  std::fprintf(stderr, "rank %d: allreduce #1 done (%g)\n", pg->rank(), t.sum().item<double>());
  if (pg->rank() == 1) {
    if (mode == "exit") std::_Exit(3);
    std::this_thread::sleep_for(60s);  // skipped allreduce #2; the launcher ends us before this
    return 0;
  }
  pg->allreduce(t)->wait();  // throws; left uncaught it ends the process
  std::fprintf(stderr, "rank 0: allreduce #2 unexpectedly completed\n");
  return 0;
}
