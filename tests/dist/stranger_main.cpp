// Not a gtest: the programs store_strangers.sh runs to try a live TCP job as a cluster's
// network would (see that script for the checks).
//   stranger_main job OUTDIR      one rank of the job (started torchrun-style): bootstrap,
//       barriers, collectives and DDP steps; writes OUTDIR/rank<R>.txt (its results),
//       OUTDIR/last_collective_<R> (wall clock, ns) and OUTDIR/hwm_<R> (peak RSS, KiB).
//       With EMBER_STRANGER_WAIT_FILE set, rank 0 then waits for that file (the intruder is
//       done) and checks through a fresh store connection that no forged key arrived.
//   stranger_main fuzz PORT SECONDS   a stranger at 127.0.0.1:PORT for SECONDS: 200 idle
//       connections held throughout, and connections sending random bytes, truncated
//       requests, unknown request types and huge announced lengths (some then stall).
//   stranger_main intruder PORT WAIT_FILE   forged set and add requests with a wrong secret
//       and with none; exits 0 when every one was refused, then creates WAIT_FILE.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <ember/dist/dist.h>
#include <ember/dist/tcp_store.h>
#include <ember/nn/layers.h>
#include <ember/optim/sgd.h>
#include <ember/tensor/layer_ops.h>
#include <ember/tensor/ops.h>
#include <ember/tensor/random.h>

namespace {

using namespace std::chrono_literals;
namespace dist = ember::dist;
using ember::Tensor;

int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string peak_rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::to_string(std::stoll(line.substr(6)));
  }
  return "-1";
}

std::string values(const Tensor& t) {
  std::string out;
  for (const float v : t.contiguous().to_vector<float>()) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.9g ", v);
    out += text;
  }
  return out + "\n";
}

int job(const std::string& outdir) {
  const dist::LaunchEnv launch = dist::read_launch_env();
  std::string results;
  {
    auto pg = std::make_shared<dist::TcpProcessGroup>(
        launch.master_addr, launch.master_port, launch.rank, launch.world_size, launch.local_rank,
        dist::ProcessGroupOptions{.timeout = 60s});
    const int rank = pg->rank(), size = pg->size();
    ember::Generator gen(11);
    ember::manual_seed(11);  // the same weights in the quiet and the disturbed run
    auto model = std::make_shared<ember::nn::Linear>(6, 3);
    auto ddp = std::make_shared<dist::DistributedDataParallel>(model, pg);
    ember::optim::SGD sgd(ddp->parameters(), {.lr = 0.05});
    for (int round = 0; round < 40; ++round) {
      pg->barrier()->wait();
      Tensor a = ember::arange(0, 8, 1, ember::kF32) * static_cast<double>(rank + 1) + round;
      pg->allreduce(a)->wait();
      Tensor b = ember::full({4}, static_cast<double>(rank * 10 + round), ember::kF32);
      pg->broadcast(b, round % size)->wait();
      std::vector<Tensor> gathered;
      for (int r = 0; r < size; ++r) gathered.push_back(ember::zeros({2}, ember::kF32));
      pg->allgather(gathered, ember::full({2}, static_cast<double>(rank + round), ember::kF32))
          ->wait();
      // One DDP step on this rank's share of a global batch of 6 rows per rank.
      Tensor x = ember::randn({6 * size, 6}, ember::kF32, &gen);
      Tensor y = ember::randn({6 * size, 3}, ember::kF32, &gen);
      Tensor loss = ember::mse_loss((*ddp)(x.narrow(0, 6 * rank, 6)), y.narrow(0, 6 * rank, 6));
      sgd.zero_grad();
      loss.backward();
      sgd.step();
      results += values(a) + values(b);
      for (const Tensor& g : gathered) results += values(g);
      std::this_thread::sleep_for(75ms);  // leaves the strangers time to try
    }
    pg->barrier()->wait();
    write_file(outdir + "/last_collective_" + std::to_string(launch.rank),
               std::to_string(wall_ns()));
    for (const auto& [name, p] : model->named_parameters()) results += name + " " + values(p);
  }
  if (const char* wait_file = std::getenv("EMBER_STRANGER_WAIT_FILE");
      wait_file != nullptr && launch.rank == 0) {
    for (int i = 0; i < 300 && !std::filesystem::exists(wait_file); ++i)
      std::this_thread::sleep_for(100ms);
    dist::TcpStore check(launch.master_addr, launch.master_port, launch.world_size, false, 300ms);
    bool forged = false;
    try {
      check.get("stranger/forged");
      forged = true;
    } catch (const ember::Error&) {
    }
    for (int r = 0; r < launch.world_size; ++r)
      forged = forged || check.add("ember/tcp/groups/" + std::to_string(r), 0) != 1;
    write_file(outdir + "/forged_" + std::to_string(launch.rank), forged ? "changed" : "absent");
  }
  write_file(outdir + "/rank" + std::to_string(launch.rank) + ".txt", results);
  write_file(outdir + "/hwm_" + std::to_string(launch.rank), peak_rss_kib());
  return 0;
}

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
  ::close(fd);
  return -1;
}

std::string u64(uint64_t n) { return std::string(reinterpret_cast<const char*>(&n), sizeof(n)); }

std::string frame(uint8_t op, const std::string& key, const std::string& value) {
  return std::string(1, static_cast<char>(op)) + u64(key.size()) + key + u64(value.size()) + value;
}

int fuzz(int port, int seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  std::mt19937_64 random(port);
  std::vector<int> idle, stalled;
  // 200 idle connections, opened alongside the broken requests below, as soon as the store
  // is up (rank 0 starts with us).
  std::thread holder([&] {
    while (std::chrono::steady_clock::now() < end && idle.size() < 200) {
      const int fd = connect_to(port);
      if (fd >= 0) {
        idle.push_back(fd);
      } else {
        std::this_thread::sleep_for(10ms);
      }
    }
  });
  int sent = 0;
  while (std::chrono::steady_clock::now() < end) {
    const int fd = connect_to(port);
    if (fd < 0) {
      std::this_thread::sleep_for(20ms);
      continue;
    }
    std::string bytes;
    bool stall = false;
    switch (random() % 5) {
      case 0: {  // random bytes
        bytes.resize(1 + random() % 8192);
        for (char& c : bytes) c = static_cast<char>(random());
        break;
      }
      case 1: {  // a well-formed request, truncated
        const std::string whole = frame(1, "stranger/key", std::string(100, 'v'));
        bytes = whole.substr(0, 1 + random() % (whole.size() - 1));
        stall = random() % 2 == 0;
        break;
      }
      case 2:  // a huge key, announced
        bytes = std::string(1, '\x01') + u64(uint64_t{1} << (30 + random() % 30)) + "key";
        stall = true;
        break;
      case 3:  // a huge value, announced, a little of it sent
        bytes = std::string(1, '\x01') + u64(3) + "key" + u64(uint64_t{1} << (20 + random() % 40)) +
                std::string(4096, 'x');
        stall = true;
        break;
      default:  // a request type that does not exist
        bytes = frame(static_cast<uint8_t>(4 + random() % 250), "key", "value");
        break;
    }
    ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    ++sent;
    if (stall && stalled.size() < 50) {
      stalled.push_back(fd);
    } else {
      ::close(fd);
    }
    std::this_thread::sleep_for(5ms);
  }
  holder.join();
  std::fprintf(stderr, "stranger: held %zu idle connections, sent %d broken requests\n",
               idle.size(), sent);
  for (const int fd : idle) ::close(fd);
  for (const int fd : stalled) ::close(fd);
  return 0;
}

int intruder(int port, const std::string& wait_file) {
  // Every attempt at once: each is refused only after the store's handshake deadline.
  std::atomic<int> accepted{0};
  std::vector<std::thread> attempts;
  for (const std::string& secret : {std::string("not the job's secret"), std::string()}) {
    attempts.emplace_back([&, secret] {
      const std::string what = secret.empty() ? "no secret" : "wrong secret";
      try {
        dist::TcpStore store("127.0.0.1", port, 2, false, 30s, {.secret = secret});
        store.set("stranger/forged", "forged");
        store.add("ember/tcp/groups/0", 100);
        std::fprintf(stderr, "intruder: %s: served (a forged key was written)\n", what.c_str());
        ++accepted;
      } catch (const ember::Error& e) {
        std::fprintf(stderr, "intruder: %s: refused: %s\n", what.c_str(), e.what());
      }
    });
  }
  for (const std::string& forged :
       {frame(1, "stranger/forged", "forged"), frame(3, "ember/tcp/groups/0", u64(100)),
        frame(1, "stranger/forged", std::string(200, 'f'))}) {
    attempts.emplace_back([&, forged] {
      int fd = -1;
      for (int i = 0; i < 3000 && fd < 0; ++i) {
        fd = connect_to(port);
        if (fd < 0) std::this_thread::sleep_for(10ms);
      }
      if (fd < 0) return;
      ::send(fd, forged.data(), forged.size(), MSG_NOSIGNAL);
      // A served request is answered with status 0; the job's store sends its challenge
      // ("EMBA" and a nonce) and hangs up.
      char reply[64];
      timeval tv{15, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      const ssize_t got = ::recv(fd, reply, sizeof(reply), MSG_WAITALL);
      if (got > 0 && reply[0] == 0) ++accepted;
      ::close(fd);
    });
  }
  for (auto& t : attempts) t.join();
  write_file(wait_file, "done");
  return accepted.load() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "job" && argc == 3) return job(argv[2]);
    if (mode == "fuzz" && argc == 4) return fuzz(std::atoi(argv[2]), std::atoi(argv[3]));
    if (mode == "intruder" && argc == 4) return intruder(std::atoi(argv[2]), argv[3]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stranger_main %s: %s\n", mode.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr,
               "usage: stranger_main job OUTDIR | fuzz PORT SECONDS | intruder PORT WAIT_FILE\n");
  return 2;
}
