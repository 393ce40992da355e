// ember's MPI process group against raw MPI_Allreduce, same job, same buffer: f32 sum
// all-reduce of 4 KiB to 64 MiB. Run under mpirun (mpirun -np 2 bench/allreduce); rank 0
// prints one JSON line per size with the median time of each (and, for reference, of raw
// MPI_Iallreduce + MPI_Wait), the bus bandwidth (bytes * 2 (n - 1) / n / time, as nccl-tests
// reports it) and ember / raw. Above 24 MiB Open MPI's single call slows down about tenfold
// on one node, which ember avoids by issuing pieces of 16 MiB: ratios there exceed 1.
//
// With --tcp, ember's TCP process group is also built over the same ranks (rank 0's address
// 127.0.0.1 and a free port shared through MPI_Bcast: one node) and, after the lines above,
// one JSON line per size ("bench": "allreduce_tcp") compares it with raw MPI_Allreduce, the two
// taking turns as above. For a fair "MPI over TCP" reference, keep MPI off shared memory:
//   mpirun --mca btl tcp,self -np 2 build/bench/allreduce --tcp
//
// With --cuda (CUDA builds, a GPU visible), the same sizes on CUDA tensors instead, on GPU
// local_rank % count: at one rank, ember's NCCL group against raw ncclAllReduce on a
// communicator of its own ("bench": "allreduce_nccl"); at more ranks, ember's MPI group, which
// stages CUDA tensors through pinned host memory, against the same staging written out by hand
// (cudaMemcpy to a pinned buffer, MPI_Allreduce, cudaMemcpy back; "allreduce_mpi_cuda").
//   build/bench/allreduce --cuda
//   mpirun -np 2 build/bench/allreduce --cuda      (two ranks may share one GPU)
//
// With --recorder, only the flight recorder's cost (flight_recorder.h): two MPI groups over
// the same ranks, one recording and one not, take turns in batches of 100 all-reduces of 4 KiB
// and of 64 KiB ("bench": "flight_recorder": microseconds per call of each, the difference in
// percent), and the recorder's own nanoseconds per collective (issued, started and ended: the
// three records one collective makes), in thread CPU time on a recorder of its own.
//   mpirun -np 2 build/bench/allreduce --recorder
#include <mpi.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <ember/dist/detail/flight.h>
#include <ember/dist/dist.h>
#include <ember/tensor/ops.h>

#include "bench_util.h"

#if EMBER_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include <ember/tensor/cuda.h>
#endif

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The slowest rank's time for one call of `fn`.
template <typename F>
double timed(F&& fn) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = now();
  fn();
  double elapsed = now() - start, slowest = 0;
  MPI_Allreduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

double median(std::vector<double> times) {
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct Medians {
  double raw, group;  // seconds per all-reduce: raw MPI_Allreduce, then `group`'s
};

// A reference and ember's call take turns, each first in half of the rounds, so neither a
// slow spell of the machine nor the call that ran just before favours one.
Medians alternate(const std::function<void()>& reference, const std::function<void()>& ours,
                  int reps) {
  const std::function<void()> methods[2] = {reference, ours};
  std::vector<double> times[2];
  const int warmup = std::max(2, reps / 10);  // untimed rounds first, in both orders
  for (int i = 0; i < reps + warmup; ++i) {
    for (int k = 0; k < 2; ++k) {
      const int m = (i + k) % 2;
      const double t = timed(methods[m]);
      if (i >= warmup) times[m].push_back(t);
    }
  }
  return {median(times[0]), median(times[1])};
}

// Raw MPI_Allreduce against the group's allreduce(b)->wait().
Medians alternate_with_raw_mpi(ember::dist::ProcessGroup& group, const ember::Tensor& b, int reps) {
  const int n = static_cast<int>(b.numel());
  return alternate(
      [&] { MPI_Allreduce(MPI_IN_PLACE, b.data_ptr(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
      [&] { group.allreduce(b)->wait(); }, reps);
}

// Bus bandwidth in GB/s of an all-reduce of `bytes` over `size` ranks taking `seconds`, as
// nccl-tests reports it.
double busbw_gbs(size_t bytes, int size, double seconds) {
  const double factor = size > 1 ? 2.0 * (size - 1) / size : 1.0;
  return static_cast<double>(bytes) * factor / seconds / 1e9;
}

// Timed calls per method at `bytes`: about 256 MiB moved, from 2000 calls (small sizes, whose
// microsecond medians need many samples) down to 10.
int reps_for(size_t bytes) {
  return static_cast<int>(std::clamp<size_t>((256u << 20) / bytes, 10, 2000));
}

// ember's TCP group against raw MPI_Allreduce, taking turns; one JSON line per size.
void bench_tcp(int rank, int size) {
  int port = rank == 0 ? ember::bench::free_port() : 0;
  MPI_Bcast(&port, 1, MPI_INT, 0, MPI_COMM_WORLD);
  ember::dist::TcpProcessGroup pg("127.0.0.1", port, rank, size, rank);
  for (size_t bytes = 4 << 10; bytes <= (64u << 20); bytes *= 4) {
    const auto n = static_cast<int64_t>(bytes / sizeof(float));
    ember::Tensor b = ember::full({n}, 1.0 / size, ember::kF32);
    const int reps = reps_for(bytes);
    const auto [raw, tcp] = alternate_with_raw_mpi(pg, b, reps);
    const double raw_bw = busbw_gbs(bytes, size, raw), tcp_bw = busbw_gbs(bytes, size, tcp);
    if (rank == 0) {
      std::printf(
          "{\"bench\": \"allreduce_tcp\", \"ranks\": %d, \"bytes\": %zu, \"dtype\": \"f32\", "
          "\"tcp_us\": %.2f, \"mpi_us\": %.2f, \"tcp_busbw_gbs\": %.3f, "
          "\"mpi_busbw_gbs\": %.3f, \"ratio\": %.3f}\n",
          size, bytes, tcp * 1e6, raw * 1e6, tcp_bw, raw_bw, tcp_bw / raw_bw);
      std::fflush(stdout);
    }
  }
}

#if EMBER_WITH_CUDA
void check_cuda(cudaError_t code, const char* what) {
  if (code != cudaSuccess) {
    std::fprintf(stderr, "allreduce: %s: %s\n", what, cudaGetErrorString(code));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

void check_nccl(ncclResult_t code, const char* what) {
  if (code != ncclSuccess) {
    std::fprintf(stderr, "allreduce: %s: %s\n", what, ncclGetErrorString(code));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

void print_cuda_line(const char* bench, const char* reference, int size, size_t bytes,
                     const Medians& m) {
  const double ref_bw = busbw_gbs(bytes, size, m.raw), ours_bw = busbw_gbs(bytes, size, m.group);
  std::printf(
      "{\"bench\": \"%s\", \"ranks\": %d, \"bytes\": %zu, \"dtype\": \"f32\", "
      "\"ember_us\": %.2f, \"%s_us\": %.2f, \"ember_busbw_gbs\": %.3f, "
      "\"%s_busbw_gbs\": %.3f, \"ratio\": %.3f}\n",
      bench, size, bytes, m.group * 1e6, reference, m.raw * 1e6, ours_bw, reference, ref_bw,
      ours_bw / ref_bw);
  std::fflush(stdout);
}

// One rank: ember's NCCL group against ncclAllReduce on a communicator and stream of its own,
// both timed until the host has synchronized with the result.
void bench_nccl_world_of_one() {
  using namespace ember;
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, 1, id, 0), "ncclCommInitRank");
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  dist::NcclProcessGroup pg(0, 1, 0, 0, dist::NcclProcessGroup::create_unique_id());
  for (size_t bytes = 4 << 10; bytes <= (64u << 20); bytes *= 4) {
    const auto n = static_cast<int64_t>(bytes / sizeof(float));
    Tensor b = full({n}, 1.0, TensorOptions(kF32, cuda_device(0)));
    cuda::synchronize();
    const Medians m = alternate(
        [&] {
          check_nccl(ncclAllReduce(b.data_ptr(), b.data_ptr(), static_cast<size_t>(n), ncclFloat,
                                   ncclSum, comm, stream),
                     "ncclAllReduce");
          check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        },
        [&] {
          pg.allreduce(b)->wait();  // orders the current stream after the collective
          cuda::current_stream().synchronize();
        },
        reps_for(bytes));
    print_cuda_line("allreduce_nccl", "nccl", 1, bytes, m);
  }
  check_nccl(ncclCommDestroy(comm), "ncclCommDestroy");
  check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
}

// Several ranks: ember's MPI group on CUDA tensors against staging through pinned host memory
// by hand.
void bench_mpi_cuda(int rank, int size) {
  using namespace ember;
  const Device gpu = cuda_device(dist::read_launch_env().local_rank % cuda::device_count());
  cuda::set_device(gpu.index);
  dist::MpiProcessGroup pg;
  for (size_t bytes = 4 << 10; bytes <= (64u << 20); bytes *= 4) {
    const auto n = static_cast<int64_t>(bytes / sizeof(float));
    Tensor b = full({n}, 1.0 / size, TensorOptions(kF32, gpu));
    Tensor host = empty({n}, TensorOptions(kF32).with_pinned_memory());
    cuda::synchronize();
    const Medians m = alternate(
        [&] {
          check_cuda(cudaMemcpy(host.data_ptr(), b.data_ptr(), bytes, cudaMemcpyDeviceToHost),
                     "cudaMemcpy to host");
          MPI_Allreduce(MPI_IN_PLACE, host.data_ptr(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                        MPI_COMM_WORLD);
          check_cuda(cudaMemcpy(b.data_ptr(), host.data_ptr(), bytes, cudaMemcpyHostToDevice),
                     "cudaMemcpy to device");
        },
        [&] { pg.allreduce(b)->wait(); },  // the staged result is on the device on return
        reps_for(bytes));
    if (rank == 0) print_cuda_line("allreduce_mpi_cuda", "staged_mpi", size, bytes, m);
  }
}
#endif  // EMBER_WITH_CUDA

// --recorder: see the top of the file.
void bench_recorder(int rank, int size) {
  namespace dist = ember::dist;
  dist::set_flight_recorder_enabled(true);
  dist::MpiProcessGroup on;
  dist::set_flight_recorder_enabled(false);
  dist::MpiProcessGroup off;
  dist::set_flight_recorder_enabled(true);
  // The recorder alone: the three records of one collective, a million times.
  dist::detail::FlightRecorder alone("bench", 0, {0}, 0);
  ember::Tensor like = ember::ones({1024});
  dist::detail::Fingerprint f =
      dist::detail::Fingerprint::of(dist::detail::OpKind::kAllreduce, 0, &like, -1, 0);
  constexpr int64_t kRecords = 1000000;
  // Thread CPU time: other processes on the machine do not count.
  auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  };
  const double start = cpu_now();
  for (int64_t i = 1; i <= kRecords; ++i) {
    f.seq = i;
    alone.enqueued(f);
    alone.started(i);
    alone.ended(i, false);
  }
  const double ns_per_collective = (cpu_now() - start) / kRecords * 1e9;
  constexpr int kBatch = 100;
  for (const size_t bytes : {size_t{4} << 10, size_t{64} << 10}) {
    ember::Tensor b =
        ember::full({static_cast<int64_t>(bytes / sizeof(float))}, 1.0 / size, ember::kF32);
    const int rounds = 400;
    const Medians m = alternate(
        [&] {
          for (int k = 0; k < kBatch; ++k) off.allreduce(b)->wait();
        },
        [&] {
          for (int k = 0; k < kBatch; ++k) on.allreduce(b)->wait();
        },
        rounds);
    if (rank == 0) {
      std::printf(
          "{\"bench\": \"flight_recorder\", \"ranks\": %d, \"bytes\": %zu, "
          "\"recorder_off_us\": %.3f, \"recorder_on_us\": %.3f, \"overhead_pct\": %.2f, "
          "\"ns_per_collective\": %.1f, \"ns_per_record\": %.1f}\n",
          size, bytes, m.raw / kBatch * 1e6, m.group / kBatch * 1e6,
          (m.group / m.raw - 1.0) * 100.0, ns_per_collective, ns_per_collective / 3);
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  bool tcp = false, cuda = false, recorder = false;
  for (int i = 1; i < argc; ++i) {
    tcp = tcp || std::strcmp(argv[i], "--tcp") == 0;
    cuda = cuda || std::strcmp(argv[i], "--cuda") == 0;
    recorder = recorder || std::strcmp(argv[i], "--recorder") == 0;
  }
  if (recorder) {
    bench_recorder(rank, size);
    MPI_Finalize();
    return 0;
  }
  if (cuda) {
#if EMBER_WITH_CUDA
    if (!ember::cuda::is_available()) {
      if (rank == 0) std::fprintf(stderr, "allreduce --cuda: no CUDA device visible\n");
      MPI_Finalize();
      return 1;
    }
    if (size == 1) {
      bench_nccl_world_of_one();
    } else {
      bench_mpi_cuda(rank, size);
    }
    MPI_Finalize();
    return 0;
#else
    if (rank == 0) std::fprintf(stderr, "allreduce --cuda: ember was built without CUDA\n");
    MPI_Finalize();
    return 1;
#endif
  }
  {
    ember::dist::MpiProcessGroup pg;
    for (size_t bytes = 4 << 10; bytes <= (64u << 20); bytes *= 4) {
      const auto n = static_cast<int64_t>(bytes / sizeof(float));
      // One buffer for all: 1/size, so sums stay put (they reach inf only after many
      // rounds, which costs an add nothing).
      ember::Tensor b = ember::full({n}, 1.0 / size, ember::kF32);
      const int reps = reps_for(bytes);
      const auto [raw, ours] = alternate_with_raw_mpi(pg, b, reps);
      // Non-blocking MPI, for reference.
      const int n_int = static_cast<int>(n);
      std::vector<double> nonblocking_times;
      for (int i = 0; i < reps + 2; ++i) {
        const double t = timed([&] {
          MPI_Request request;
          MPI_Iallreduce(MPI_IN_PLACE, b.data_ptr(), n_int, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                         &request);
          MPI_Wait(&request, MPI_STATUS_IGNORE);
        });
        if (i >= 2) nonblocking_times.push_back(t);
      }
      const double nonblocking = median(nonblocking_times);
      const double raw_bw = busbw_gbs(bytes, size, raw), ours_bw = busbw_gbs(bytes, size, ours);
      if (rank == 0) {
        std::printf(
            "{\"bench\": \"allreduce\", \"ranks\": %d, \"bytes\": %zu, \"dtype\": \"f32\", "
            "\"ember_us\": %.2f, \"mpi_us\": %.2f, \"mpi_iallreduce_us\": %.2f, "
            "\"ember_busbw_gbs\": %.3f, "
            "\"mpi_busbw_gbs\": %.3f, \"ratio\": %.3f}\n",
            size, bytes, ours * 1e6, raw * 1e6, nonblocking * 1e6, ours_bw, raw_bw,
            ours_bw / raw_bw);
        std::fflush(stdout);
      }
    }
  }
  if (tcp) bench_tcp(rank, size);
  MPI_Finalize();
  return 0;
}
