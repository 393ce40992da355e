// The program the install tests build against each installed ember (cmake --install, the
// Debian packages), with the README's CMake snippet and with pkg-config: what a PyTorch user
// writes first, with the answers checked. Exit status 0 when every answer is right.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include <ember/ember.h>

namespace {
int failures = 0;
void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "consumer: wrong: %s\n", what);
    ++failures;
  }
}
}  // namespace

int main() {
  using namespace ember;
  try {
    // The library loaded is the one the headers describe.
    check(version() == std::string_view(EMBER_VERSION), "ember::version() == EMBER_VERSION");

    // Autograd: y = sum(3x^2 + x) = 48 at x = (1, 2, 3); dy/dx = 6x + 1.
    Tensor x = from_vector<double>({1, 2, 3}, {3});
    x.requires_grad_();
    Tensor y = (x * x * 3 + x).sum();
    y.backward();
    check(y.item<double>() == 48, "sum(3x^2 + x) at x = (1, 2, 3) is 48");
    check(x.grad().to_vector<double>() == std::vector<double>({7, 13, 19}), "dy/dx = 6x + 1");

    // Second derivatives as torch.autograd.grad(..., create_graph=True) takes them: for
    // z = sum(x^3 + tanh(x)), dz/dx = 3x^2 + 1 - tanh^2, and its gradient 6x - 2 tanh (1 - tanh^2).
    Tensor xs = from_vector<double>({0.5, -1}, {2});
    xs.requires_grad_();
    const Tensor dz = autograd::grad({(xs * xs * xs + tanh(xs)).sum()}, {xs}, {}, std::nullopt,
                                     /*create_graph=*/true)[0];
    const Tensor d2z = autograd::grad({dz.sum()}, {xs})[0];
    bool second_ok = !xs.grad().defined();
    for (int i = 0; i < 2; ++i) {
      const double v = i == 0 ? 0.5 : -1.0, t = std::tanh(v);
      second_ok = second_ok &&
                  std::fabs(dz.to_vector<double>()[i] - (3 * v * v + 1 - t * t)) < 1e-12 &&
                  std::fabs(d2z.to_vector<double>()[i] - (6 * v - 2 * t * (1 - t * t))) < 1e-12;
    }
    check(second_ok, "autograd::grad with create_graph gives the second derivative");

    // nn + optim: SGD fits a Linear layer to t = 2a - b + 0.5 on the four corners of the
    // unit square, where least squares is exact.
    manual_seed(0);
    nn::Linear layer(2, 1);
    optim::SGD optimizer(layer.parameters(), {.lr = 0.5});
    const Tensor inputs = from_vector<float>({0, 0, 1, 0, 0, 1, 1, 1}, {4, 2});
    const Tensor targets = from_vector<float>({0.5f, 2.5f, -0.5f, 1.5f}, {4, 1});
    double loss = 0;
    for (int step = 0; step < 500; ++step) {
      optimizer.zero_grad();
      Tensor l = mse_loss(layer.forward(inputs), targets);
      l.backward();
      optimizer.step();
      loss = l.item<double>();
    }
    const std::vector<float> w = layer.weight.to_vector<float>();
    const float b = layer.bias.item<float>();
    check(loss < 1e-8, "SGD drives the loss to 0");
    check(std::fabs(w[0] - 2) < 1e-3 && std::fabs(w[1] + 1) < 1e-3 && std::fabs(b - 0.5f) < 1e-3,
          "SGD finds weight (2, -1) and bias 0.5");

    // dist: a checkpoint of the fitted layer, written as a Trainer snapshot, found by
    // apps::list_snapshots (the Trainer's library) and read back into a fresh layer.
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("ember-consumer-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "checkpoint-step-500.safetensors").string();
    dist::save_checkpoint(path, {.model = &layer, .step = 500});
    const std::vector<apps::SnapshotFile> snapshots = apps::list_snapshots(dir.string());
    check(snapshots.size() == 1 && snapshots[0].path == path && snapshots[0].step == 500,
          "apps::list_snapshots finds the snapshot of step 500");
    nn::Linear restored(2, 1);
    dist::Checkpoint into{.model = &restored};
    dist::load_checkpoint(path, into);
    std::filesystem::remove_all(dir);
    check(restored.weight.to_vector<float>() == w && restored.bias.item<float>() == b &&
              into.step == 500,
          "a checkpoint restores the layer and the step");

    // profiler: torch.profiler's loop. Steps 0-1 wait, 2 warms up, 3-4 are recorded; the
    // trace names the recorded steps, the Linear's forward and backward and the user's range.
    int windows = 0;
    profiler::Profiler prof({.schedule = profiler::schedule(2, 1, 2, 1),
                             .on_trace_ready = [&](profiler::Profiler&) { ++windows; }});
    prof.start();
    for (int step = 0; step < 6; ++step) {
      profiler::RecordFunction range("train_step");
      optimizer.zero_grad();
      mse_loss(layer(inputs), targets).backward();
      optimizer.step();
      prof.step();
    }
    prof.stop();
    const std::string trace_path = (dir / "trace.json").string();
    std::filesystem::create_directories(dir);
    prof.export_chrome_trace(trace_path);
    std::string trace;
    if (FILE* f = std::fopen(trace_path.c_str(), "rb")) {
      char buffer[4096];
      for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, f)) > 0;) trace.append(buffer, n);
      std::fclose(f);
    }
    std::filesystem::remove_all(dir);
    const auto has = [&trace](const char* text) { return trace.find(text) != std::string::npos; };
    check(windows == 1, "one window of active steps ends (on_trace_ready once)");
    check(has("{\"traceEvents\":[") && has("\"ProfilerStep#3\"") && has("\"ProfilerStep#4\"") &&
              !has("\"ProfilerStep#2\"") && !has("\"ProfilerStep#5\""),
          "the trace holds steps 3 and 4 only");
    check(has("\"name\":\"Linear\",\"cat\":\"forward\"") &&
              has("\"name\":\"Linear\",\"cat\":\"backward\"") && has("\"train_step\""),
          "the trace holds the Linear's forward and backward and the record_function range");

    std::printf("consumer: ember %s, loss %.3g, weight (%.4f, %.4f), bias %.4f\n",
                std::string(version()).c_str(), loss, w[0], w[1], b);
  } catch (const Error& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
