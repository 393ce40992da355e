// The program the two-host test runs: a few DDP steps of ResNet-20 between two ranks, each
// on its own (namespaced) host. Rank 0 prints the hosts that took part and whether the final
// parameters agree on every rank.
#include <arpa/inet.h>
#include <ifaddrs.h>

#include <cstdio>
#include <cstring>
#include <string>

#include <ember/ember.h>

using namespace ember;

namespace {

// This host's IPv4 address outside loopback (the namespace's veth address).
std::string host_address() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "unknown";
  std::string found = "unknown";
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
    if (std::strncmp(text, "127.", 4) != 0) {
      found = text;
      break;
    }
  }
  freeifaddrs(list);
  return found;
}

}  // namespace

int main() {
  try {
    auto group = dist::init_process_group();
    EMBER_CHECK(group->size() == 2, "two_host_check", "expected 2 ranks, got ", group->size());
    // Which host each rank is on: the four bytes of its address, gathered.
    const std::string address = host_address();
    in_addr parsed{};
    inet_pton(AF_INET, address.c_str(), &parsed);
    const Tensor mine = from_vector<int64_t>({static_cast<int64_t>(ntohl(parsed.s_addr))});
    std::vector<Tensor> all{zeros({1}, kI64), zeros({1}, kI64)};
    group->allgather(all, mine)->wait();

    set_num_threads(1);
    manual_seed(static_cast<uint64_t>(group->rank()));  // DDP must still start every rank equal
    auto model = nn::resnet20();
    dist::DistributedDataParallel ddp(model, group);
    optim::SGDOptions options;
    options.lr = 0.05;
    options.momentum = 0.9;
    options.nesterov = true;
    optim::SGD optimizer(model->parameters(), options);
    Generator data(10 + static_cast<uint64_t>(group->rank()));  // each host its own batch
    for (int step = 0; step < 3; ++step) {
      const Tensor x = randn({8, 3, 32, 32}, kF32, &data);
      const Tensor y = randint(0, 10, {8}, kI64, &data);
      optimizer.zero_grad();
      cross_entropy(ddp.forward(x), y).backward();
      optimizer.step();
    }
    // Every parameter, flattened, must be identical on both ranks.
    std::vector<Tensor> flat;
    for (const Tensor& p : model->parameters()) flat.push_back(p.detach().flatten());
    const Tensor params = cat(flat);
    std::vector<Tensor> gathered{empty_like(params), empty_like(params)};
    group->allgather(gathered, params)->wait();
    const bool agree = equal(gathered[0], gathered[1]);
    if (group->rank() == 0) {
      for (int r = 0; r < 2; ++r) {
        const auto a = static_cast<uint32_t>(all[static_cast<size_t>(r)].item<int64_t>());
        std::printf("rank %d on host %u.%u.%u.%u\n", r, a >> 24, (a >> 16) & 255, (a >> 8) & 255,
                    a & 255);
      }
      std::printf("parameters %s across hosts (%ld values)\n", agree ? "agree" : "DIFFER",
                  static_cast<long>(params.numel()));
    }
    return agree ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "two_host_check: %s\n", e.what());
    return 1;
  }
}
