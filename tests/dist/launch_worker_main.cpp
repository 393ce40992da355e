// Not a gtest: the worker program launch_tests.sh starts under ember-run (see that script for
// the checks). Every mode but `client` runs as one rank of a TCP job on the CPU.
//   launch_worker check OUTDIR       checks the launch variables, all-reduces, broadcasts and
//       all-gathers; writes OUTDIR/rank<R>.txt: "rank R local L world W local_world LW
//       node N restart C sum S gathered G fds F secret <path or none>" (F: descriptors it
//       inherited besides stdin, stdout and stderr).
//   launch_worker train OUTDIR STEPS [KILL_RANK KILL_STEP]   DDP on a small linear model with
//       SGD + momentum, a snapshot (dist/checkpoint.h) after every step, resumed from at start;
//       in the first round (EMBER_RESTART_COUNT=0) rank KILL_RANK sends itself SIGKILL in the
//       middle of step KILL_STEP. Rank 0 writes the final parameters to OUTDIR/final.bin; a
//       rank that resumed writes the step it resumed at to OUTDIR/resumed<R>.
//   launch_worker elastic OUTDIR STEPS PAUSE_MS   as train (without the kill), for an elastic
//       job whose world size changes between rounds: resumes from the snapshot, pauses PAUSE_MS
//       after each step, writes OUTDIR/round<C>.rank<R> ("world W resumed S", S = -1 when it
//       started afresh; C: EMBER_RESTART_COUNT) at start, OUTDIR/step (rank 0: "round C world
//       W step S") after each step and OUTDIR/final.txt (rank 0: "step S world W") at the end.
//   launch_worker die OUTDIR RANK    writes OUTDIR/pid<R>; rank RANK then sends itself SIGKILL,
//       the others wait in a barrier (the group timeout is 60 s: only the launcher ends them).
//   launch_worker wait OUTDIR        writes OUTDIR/pid<R> and OUTDIR/ready<R> (the job secret's
//       file), waits for OUTDIR/stop (60 s at most), then a barrier.
//   launch_worker threads OUTDIR     writes OUTDIR/threads<RANK>.txt: "omp_num_threads E threads
//       T" (E: OMP_NUM_THREADS as the worker found it, or unset; T: get_num_threads()).
//   launch_worker client PORT SECRET_FILE|none   a store client at 127.0.0.1:PORT: sets and
//       reads a key; exits 0 when served, 3 when refused.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <ember/ember.h>

namespace {

using namespace ember;
using namespace ember::dist;

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) throw Error(std::string("launch_worker: ") + name + " is not set");
  return std::atoi(v);
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path + ".tmp");
  out << text;
  out.close();
  std::filesystem::rename(path + ".tmp", path);
}

void init(int timeout_s) {
  InitOptions o;
  o.backend = "tcp";
  o.device = kCPU;
  o.timeout = std::chrono::seconds(timeout_s);
  init_process_group(o);
}

// The descriptors this process holds besides stdin, stdout and stderr.
int extra_fds() {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    if (std::stoi(entry.path().filename().string()) > 2) ++n;
  }
  return n - 1;  // the iterator's own
}

int check(const std::string& out) {
  const int inherited = extra_fds();
  const int rank = env_int("RANK"), local = env_int("LOCAL_RANK"), world = env_int("WORLD_SIZE");
  const int local_world = env_int("LOCAL_WORLD_SIZE"), node = env_int("GROUP_RANK");
  if (rank != node * local_world + local || world % local_world != 0) {
    throw Error("launch_worker: inconsistent launch variables");
  }
  init(30);
  if (get_rank() != rank || get_world_size() != world || get_local_rank() != local) {
    throw Error("launch_worker: the group disagrees with the launch variables");
  }
  Tensor t = full({4}, static_cast<double>(rank + 1), kF64);
  all_reduce(t);
  Tensor b = full({2}, rank == 0 ? 42.0 : -1.0, kF64);
  broadcast(b, 0);
  if (b.to_vector<double>() != std::vector<double>{42.0, 42.0}) throw Error("broadcast failed");
  std::vector<Tensor> gathered;
  for (int r = 0; r < world; ++r) gathered.push_back(zeros({1}, kF64));
  all_gather(gathered, full({1}, static_cast<double>(rank), kF64));
  double gathered_sum = 0;
  for (int r = 0; r < world; ++r) {
    if (gathered[static_cast<size_t>(r)].item<double>() != r) throw Error("all_gather failed");
    gathered_sum += r;
  }
  barrier();
  destroy_process_group();
  std::ostringstream line;
  line << "rank " << rank << " local " << local << " world " << world << " local_world "
       << local_world << " node " << node << " restart " << env_int("EMBER_RESTART_COUNT")
       << " sum " << t.to_vector<double>()[0] << " gathered " << gathered_sum << " fds "
       << inherited << " secret " << env_or("EMBER_JOB_SECRET_FILE", "none") << "\n";
  write_file(out + "/rank" + std::to_string(rank) + ".txt", line.str());
  return 0;
}

// train, and elastic when pause_ms >= 0 (see the modes above).
int train(const std::string& out, int steps, int kill_rank, int kill_step, int pause_ms = -1) {
  const bool elastic = pause_ms >= 0;
  init(elastic ? 60 : 20);  // elastic: far above the launchers' heartbeat timeout
  const int rank = get_rank(), world = get_world_size();
  const std::string round = std::to_string(env_int("EMBER_RESTART_COUNT"));
  manual_seed(7);
  auto net = std::make_shared<nn::Linear>(4, 3);
  auto ddp = std::make_shared<DistributedDataParallel>(net, get_default_group());
  optim::SGDOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  optim::SGD sgd(ddp->parameters(), o);
  Checkpoint ck;
  ck.model = &ddp->module();
  ck.optimizer = &sgd;
  const std::string snapshot = out + "/snapshot.ckpt";
  int64_t resumed = -1;
  if (std::filesystem::exists(snapshot)) {
    load_checkpoint(snapshot, ck);
    resumed = ck.step;
    if (!elastic) write_file(out + "/resumed" + std::to_string(rank), std::to_string(ck.step));
  }
  if (elastic) {
    write_file(out + "/round" + round + ".rank" + std::to_string(rank),
               "world " + std::to_string(world) + " resumed " + std::to_string(resumed) + "\n");
  }
  const bool first_round = round == "0";
  while (ck.step < steps) {
    Generator gen(1000 + static_cast<uint64_t>(ck.step) * 64 + static_cast<uint64_t>(rank));
    const Tensor x = randn({8, 4}, kF32, &gen);
    const Tensor y = randn({8, 3}, kF32, &gen);
    Tensor loss = mse_loss((*ddp)(x), y);
    sgd.zero_grad();
    if (first_round && rank == kill_rank && ck.step == kill_step) ::raise(SIGKILL);
    loss.backward();
    sgd.step();
    ++ck.step;
    save_checkpoint(snapshot, ck, get_default_group().get());
    if (!elastic) continue;
    if (rank == 0) {
      write_file(out + "/step", "round " + round + " world " + std::to_string(world) + " step " +
                                    std::to_string(ck.step) + "\n");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  }
  if (rank == 0) {
    std::string bytes;
    for (const Tensor& p : net->parameters()) {
      const auto values = p.to_vector<float>();
      bytes.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    }
    write_file(out + "/final.bin", bytes);
    if (elastic) {
      write_file(out + "/final.txt",
                 "step " + std::to_string(ck.step) + " world " + std::to_string(world) + "\n");
    }
  }
  destroy_process_group();
  return 0;
}

int die(const std::string& out, int victim) {
  init(60);
  write_file(out + "/pid" + std::to_string(get_rank()), std::to_string(::getpid()));
  barrier();
  if (get_rank() == victim) ::raise(SIGKILL);
  barrier();
  return 0;
}

int wait_for_stop(const std::string& out) {
  init(60);
  const int rank = get_rank();
  write_file(out + "/pid" + std::to_string(rank), std::to_string(::getpid()));
  write_file(out + "/ready" + std::to_string(rank), env_or("EMBER_JOB_SECRET_FILE", "none"));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!std::filesystem::exists(out + "/stop")) {
    if (std::chrono::steady_clock::now() > deadline) throw Error("launch_worker: no stop file");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  barrier();
  destroy_process_group();
  return 0;
}

int threads(const std::string& out) {
  write_file(out + "/threads" + std::to_string(env_int("RANK")) + ".txt",
             "omp_num_threads " + env_or("OMP_NUM_THREADS", "unset") + " threads " +
                 std::to_string(get_num_threads()) + "\n");
  return 0;
}

int client(int port, const std::string& secret_file) {
  TcpStoreOptions o;
  o.secret = "";
  if (secret_file != "none") {
    std::ifstream in(secret_file);
    std::getline(in, *o.secret);
  }
  try {
    TcpStore store("127.0.0.1", port, 1, false, std::chrono::seconds(5), o);
    store.set("launch_worker/client", "was here");
    if (store.get("launch_worker/client") != "was here") return 1;
  } catch (const Error& e) {
    std::printf("refused: %s\n", e.what());
    return 3;
  }
  std::printf("served\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "check" && argc == 3) return check(argv[2]);
    if (mode == "train" && (argc == 4 || argc == 6)) {
      return train(argv[2], std::atoi(argv[3]), argc == 6 ? std::atoi(argv[4]) : -1,
                   argc == 6 ? std::atoi(argv[5]) : -1);
    }
    if (mode == "elastic" && argc == 5) {
      return train(argv[2], std::atoi(argv[3]), -1, -1, std::max(0, std::atoi(argv[4])));
    }
    if (mode == "die" && argc == 4) return die(argv[2], std::atoi(argv[3]));
    if (mode == "wait" && argc == 3) return wait_for_stop(argv[2]);
    if (mode == "threads" && argc == 3) return threads(argv[2]);
    if (mode == "client" && argc == 4) return client(std::atoi(argv[2]), argv[3]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "launch_worker (%s): %s\n", mode.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: see tests/dist/launch_worker_main.cpp\n");
  return 2;
}
