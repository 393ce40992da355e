// ember_snapshot_diff A B TOLERANCE: the model tensors ("model.*") of two ember-train
// snapshots, each a file (dist::Checkpoint) or a sharded snapshot's folder, compared: prints
// the largest difference, each tensor's scaled by the largest magnitude of A's (at least
// 1e-3), and exits 1 when it exceeds TOLERANCE (0: bit for bit), when the names or shapes
// differ, or when fewer than 5 tensors were compared (train_zero.sh).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include <ember/dist/checkpoint.h>
#include <ember/dist/sharded_checkpoint.h>
#include <ember/ember.h>

namespace {

using namespace ember;

std::map<std::string, Tensor> model_tensors(const std::string& path) {
  std::map<std::string, Tensor> out;
  if (std::filesystem::is_directory(path)) {
    const dist::ShardedCheckpoint snapshot(path);
    for (const auto& [name, info] : snapshot.tensors())
      if (name.starts_with("model.")) out[name] = snapshot.read(name);
  } else {
    for (auto& [name, t] : dist::read_checkpoint(path).tensors)
      if (name.starts_with("model.")) out[name] = t;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: ember_snapshot_diff A B TOLERANCE\n");
    return 2;
  }
  try {
    const auto a = model_tensors(argv[1]), b = model_tensors(argv[2]);
    const double tolerance = std::stod(argv[3]);
    double worst = 0;
    for (const auto& [name, ta] : a) {
      const auto it = b.find(name);
      if (it == b.end() || it->second.sizes() != ta.sizes() || it->second.dtype() != ta.dtype()) {
        std::printf("FAIL: %s differs in name, shape or dtype between %s and %s\n", name.c_str(),
                    argv[1], argv[2]);
        return 1;
      }
      const Tensor x = ta.to(kF64), y = it->second.to(kF64);
      const double scale = std::max(max(abs(x)).item<double>(), 1e-3);
      worst = std::max(worst, max(abs(x - y)).item<double>() / scale);
    }
    const bool ok = a.size() == b.size() && a.size() >= 5 && worst <= tolerance;
    std::printf("%s: %zu model tensors, largest relative difference %.3g (tolerance %g)\n",
                ok ? "ok" : "FAIL", a.size(), worst, tolerance);
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}
