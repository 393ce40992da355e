// DataLoader throughput on CIFAR-shaped data: 32x32x3 u8 images through random crop
// (padding 4) + horizontal flip + to-tensor + normalize, batch 128, shuffled, at 1 and 2
// worker threads. One JSON line per worker count; bench/loader_torchvision.py prints the
// same keys for torchvision's pipeline.
//
//   loader_bench [--quick]
#include <cstring>
#include <memory>
#include <string>

#include <ember/data/dataloader.h>
#include <ember/tensor/ops.h>
#include <ember/tensor/random.h>

#include "bench_util.h"

int main(int argc, char** argv) {
  using namespace ember;
  using namespace ember::data;
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int64_t images = quick ? 2560 : 20480;
  const int64_t batch_size = 128;

  Generator gen(0);
  auto dataset = std::make_shared<TensorDataset>(randint(0, 256, {images, 32, 32, 3}, kU8, &gen),
                                                 randint(0, 10, {images}, kI64, &gen));
  auto transform = std::make_shared<Compose>(std::vector<std::shared_ptr<const Transform>>{
      std::make_shared<RandomCrop>(32, 32, 4), std::make_shared<RandomHorizontalFlip>(),
      std::make_shared<ToTensor>(),
      std::make_shared<Normalize>(std::vector<float>{0.4914f, 0.4822f, 0.4465f},
                                  std::vector<float>{0.2470f, 0.2435f, 0.2616f})});

  for (int workers : {1, 2}) {
    DataLoaderOptions options;
    options.batch_size = batch_size;
    options.shuffle = true;
    options.seed = 0;
    options.num_workers = workers;
    options.transform = transform;
    DataLoader loader(dataset, options);
    // Every timed run loads epoch 0, so the checksum (first value of each batch, summed) is
    // the same for any worker count: the batches are.
    double checksum = 0.0;
    const auto epoch = [&] {
      loader.set_epoch(0);
      checksum = 0.0;
      for (const Batch& batch : loader) checksum += batch.data.data_ptr<float>()[0];
    };
    const double seconds = bench::median_seconds(
        {epoch}, [] {}, 1, 3, 0.5, 10)[0];
    const double per_s = static_cast<double>(images) / seconds;
    bench::JsonLine()
        .add("bench", "loader")
        .add("impl", "ember")
        .add("workers", workers)
        .add("batch", static_cast<long long>(batch_size))
        .add("images", static_cast<long long>(images))
        .add("pipeline", "crop32pad4+hflip+to_tensor+normalize")
        .add("images_per_s", per_s)
        .add("images_per_s_per_worker", per_s / workers)
        .add("checksum", checksum)
        .print();
  }
  return 0;
}
