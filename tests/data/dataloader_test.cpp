// DataLoader: batching and collation, shuffling, samplers, the same batches for any number
// of workers, errors carried to the caller with the sample index, and clean shutdown.
#include <ember/data/dataloader.h>
#include <ember/data/datasets.h>
#include <ember/tensor/cuda.h>
#include <ember/tensor/ops.h>
#include <ember/tensor/random.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <numeric>
#include <thread>

#include "data_files.h"
#include "test_util.h"

namespace ember::data {
namespace {

// n examples [2] f32 holding (i, -i), target i % 3.
std::shared_ptr<TensorDataset> small_dataset(int64_t n) {
  std::vector<float> data;
  std::vector<int64_t> targets;
  for (int64_t i = 0; i < n; ++i) {
    data.push_back(static_cast<float>(i));
    data.push_back(static_cast<float>(-i));
    targets.push_back(i % 3);
  }
  return std::make_shared<TensorDataset>(from_vector(data, {n, 2}), from_vector(targets));
}

// CIFAR-shaped random u8 images.
std::shared_ptr<TensorDataset> cifar_like(int64_t n) {
  Generator gen(3);
  return std::make_shared<TensorDataset>(randint(0, 256, {n, 32, 32, 3}, kU8, &gen),
                                         randint(0, 10, {n}, kI64, &gen));
}

std::shared_ptr<const Transform> augment() {
  return std::make_shared<Compose>(std::vector<std::shared_ptr<const Transform>>{
      std::make_shared<RandomCrop>(32, 32, 4, PadMode::kReflect),
      std::make_shared<RandomHorizontalFlip>(), std::make_shared<ToTensor>(),
      std::make_shared<Normalize>(std::vector<float>{0.5f, 0.5f, 0.5f},
                                  std::vector<float>{0.25f, 0.25f, 0.25f})});
}

std::vector<Batch> collect(DataLoader& loader) {
  std::vector<Batch> batches;
  for (const Batch& b : loader) batches.push_back(b);
  return batches;
}

TEST(TensorDataset, RowsAreViewsWithTheirTargets) {
  auto ds = small_dataset(4);
  EXPECT_EQ(ds->size(), 4);
  const Example e = ds->get(2);
  EXPECT_EQ(e.data.to_vector<float>(), (std::vector<float>{2.0f, -2.0f}));
  EXPECT_EQ(e.target, 2);
  EXPECT_TRUE(e.data.storage().is_same(ds->data().storage()));
  EXPECT_EMBER_ERROR(ds->get(4), "TensorDataset::get: index 4 is out of range for 4 examples");
  EXPECT_EMBER_ERROR(ds->get(-1), "index -1 is out of range");
  EXPECT_EMBER_ERROR(TensorDataset(zeros({3, 2}), zeros({4}, kI64)),
                     "data has 3 examples but targets has 4");
  EXPECT_EMBER_ERROR(TensorDataset(zeros({3, 2}), zeros({})),
                     "targets must have a leading example dim");
}

TEST(Subset, IsARenumberedRangeOfItsDataset) {
  auto base = small_dataset(10);
  Subset tail(base, 7, 10);
  ASSERT_EQ(tail.size(), 3);
  EXPECT_EQ(tail.get(0).data.to_vector<float>(), (std::vector<float>{7, -7}));
  EXPECT_EQ(tail.get(2).target, 9 % 3);
  EXPECT_EQ(Subset(base, 4, 4).size(), 0);
  EXPECT_EMBER_ERROR(tail.get(3), "Subset::get");
  EXPECT_EMBER_ERROR(Subset(base, 5, 11), "range [5, 11) is not within the dataset's 10 examples");
  EXPECT_EMBER_ERROR(Subset(base, 6, 5), "range [6, 5)");
}

TEST(DataLoader, FloatAndMultiLabelTargetsAreStackedInTheirDtype) {
  // Regression: one f64 value per example; multi-label: a row of 3 flags per example.
  const Tensor x = arange(12, kF32).view({6, 2});
  const Tensor values = arange(6, kF64) * 0.5;
  const Tensor labels =
      from_vector(std::vector<float>{1, 0, 1, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0, 1, 0, 1, 0, 0}, {6, 3});
  for (int workers : {0, 2}) {
    DataLoader regression(std::make_shared<TensorDataset>(x, values),
                          {.batch_size = 4, .shuffle = true, .seed = 3, .num_workers = workers});
    for (const Batch& b : regression) {
      ASSERT_EQ(b.target.dtype(), kF64);
      ASSERT_EQ(b.target.sizes(), (Shape{static_cast<int64_t>(b.indices.size())}));
      for (size_t k = 0; k < b.indices.size(); ++k)
        EXPECT_EQ(b.target.to_vector<double>()[k], 0.5 * static_cast<double>(b.indices[k]));
    }
    DataLoader multi_label(std::make_shared<TensorDataset>(x, labels),
                           {.batch_size = 4, .num_workers = workers});
    const auto batches = collect(multi_label);
    ASSERT_EQ(batches.size(), 2u);
    EXPECT_EQ(batches[0].target.sizes(), (Shape{4, 3}));
    EXPECT_EQ(batches[0].target.dtype(), kF32);
    EXPECT_TRUE(equal(batches[1].target, labels.slice(0, 4, 6)));
  }
}

TEST(DataLoader, ABatchMixingClassAndTensorTargetsIsRefused) {
  struct Mixed : Dataset {
    int64_t size() const override { return 4; }
    Example get(int64_t index) const override {
      if (index < 2) return {zeros({2}), index};
      return {.data = zeros({2}), .target_tensor = ones({1})};
    }
  };
  DataLoader loader(std::make_shared<Mixed>(), {.batch_size = 4});
  EXPECT_EMBER_ERROR(collect(loader),
                     "sample 2 (batch 0 of epoch 0) failed: collate: its target is a tensor but "
                     "the batch's first sample (index 0) has a class index");
}

TEST(DataLoader, SequentialBatchesCollateIntoContiguousTensors) {
  DataLoaderOptions options;
  options.batch_size = 4;
  auto ds = small_dataset(10);
  DataLoader loader(ds, options);
  EXPECT_EQ(&loader.dataset(), ds.get());
  EXPECT_EQ(loader.options().batch_size, 4);
  EXPECT_EQ(loader.size(), 3);
  const auto batches = collect(loader);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[0].data.sizes(), (Shape{4, 2}));
  EXPECT_TRUE(batches[0].data.is_contiguous());
  EXPECT_EQ(batches[0].target.dtype(), kI64);
  EXPECT_EQ(batches[1].data.to_vector<float>(), (std::vector<float>{4, -4, 5, -5, 6, -6, 7, -7}));
  EXPECT_EQ(batches[1].target.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 0, 1}));
  EXPECT_EQ(batches[2].data.sizes(), (Shape{2, 2}));  // the last, partial batch
  EXPECT_EQ(batches[2].indices, (std::vector<int64_t>{8, 9}));

  options.drop_last = true;
  DataLoader dropping(small_dataset(10), options);
  EXPECT_EQ(dropping.size(), 2);
  EXPECT_EQ(collect(dropping).size(), 2u);
  DataLoader empty_loader(small_dataset(0), options);
  EXPECT_EQ(empty_loader.size(), 0);
  EXPECT_TRUE(collect(empty_loader).empty());
}

TEST(DataLoader, ShuffleVisitsEveryIndexOncePerEpochInANewOrder) {
  DataLoaderOptions options;
  options.batch_size = 8;
  options.shuffle = true;
  options.seed = 9;
  options.num_workers = 2;
  DataLoader loader(small_dataset(50), options);
  std::vector<std::vector<int64_t>> orders;
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> order;
    for (const Batch& b : loader) {
      const auto values = b.data.to_vector<float>();
      for (size_t k = 0; k < b.indices.size(); ++k) {
        EXPECT_EQ(values[2 * k], static_cast<float>(b.indices[k]));  // data matches the index
        order.push_back(b.indices[k]);
      }
    }
    auto sorted = order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(50);
    std::iota(all.begin(), all.end(), int64_t{0});
    EXPECT_EQ(sorted, all);
    EXPECT_EQ(order, random_permutation(50, 9, static_cast<uint64_t>(epoch)));
    orders.push_back(order);
  }
  EXPECT_EQ(loader.epoch(), 3u);
  EXPECT_NE(orders[0], orders[1]);
  loader.set_epoch(1);  // replaying an epoch gives its order again
  std::vector<int64_t> replay;
  for (const Batch& b : loader) replay.insert(replay.end(), b.indices.begin(), b.indices.end());
  EXPECT_EQ(replay, orders[1]);
}

TEST(DataLoader, BatchesAreIdenticalForAnyWorkerCount) {
  auto ds = cifar_like(200);
  std::vector<Batch> reference;
  for (int workers : {0, 1, 2, 3, 5}) {
    for (int prefetch : {1, 3}) {
      DataLoaderOptions options;
      options.batch_size = 32;
      options.shuffle = true;
      options.seed = 21;
      options.num_workers = workers;
      options.prefetch_factor = prefetch;
      options.transform = augment();
      DataLoader loader(ds, options);
      loader.set_epoch(4);
      const auto batches = collect(loader);
      ASSERT_EQ(batches.size(), 7u);
      EXPECT_EQ(batches[0].data.sizes(), (Shape{32, 3, 32, 32}));
      EXPECT_EQ(batches[0].data.dtype(), kF32);
      EXPECT_EQ(batches[6].data.sizes(), (Shape{8, 3, 32, 32}));
      if (reference.empty()) {
        reference = batches;
        continue;
      }
      for (size_t i = 0; i < batches.size(); ++i) {
        EXPECT_EQ(batches[i].indices, reference[i].indices) << workers << " workers";
        EXPECT_TRUE(equal(batches[i].data, reference[i].data))
            << workers << " workers, batch " << i;
        EXPECT_TRUE(equal(batches[i].target, reference[i].target));
      }
    }
  }
  // Each sample is the pipeline applied with the SampleRng of (seed, epoch, index).
  const Batch& b = reference[2];
  for (size_t k = 0; k < b.indices.size(); k += 7) {
    SampleRng rng(21, 4, b.indices[k]);
    const Tensor expected = augment()->apply(ds->get(b.indices[k]).data, rng);
    EXPECT_TRUE(equal(b.data.select(0, static_cast<int64_t>(k)), expected));
    EXPECT_EQ(b.target.to_vector<int64_t>()[k], ds->targets()[static_cast<size_t>(b.indices[k])]);
  }
}

TEST(DataLoader, RecyclesBatchBuffersOnlyAfterTheCallerDropsThem) {
  auto ds = cifar_like(160);
  DataLoaderOptions options;
  options.batch_size = 16;
  options.shuffle = true;
  options.num_workers = 2;
  options.transform = augment();
  DataLoader loader(ds, options);
  std::vector<Tensor> copies;  // epoch 0, every batch held while the epoch runs
  for (const Batch& b : collect(loader)) copies.push_back(b.data.clone());
  // The same epoch again, dropping each batch when moving on: buffers come back from the
  // pool (the pool and the batch share the storage) and hold the right data.
  loader.set_epoch(0);
  size_t k = 0;
  for (const Batch& b : loader) {
    EXPECT_EQ(b.data.storage().use_count(), 2) << "batch " << k;
    ASSERT_LT(k, copies.size());
    EXPECT_TRUE(equal(b.data, copies[k])) << "batch " << k;
    ++k;
  }
  EXPECT_EQ(k, copies.size());
}

// Yields the odd indices in reverse, and records the epochs the loader set.
class OddReverseSampler : public Sampler {
 public:
  explicit OddReverseSampler(int64_t n) : n_(n) {}
  std::vector<int64_t> indices() const override {
    std::vector<int64_t> v;
    for (int64_t i = n_ - 1; i >= 0; --i)
      if (i % 2 == 1) v.push_back(i);
    return v;
  }
  int64_t size() const override { return n_ / 2; }
  std::vector<uint64_t> epochs;

 protected:
  void on_set_epoch(uint64_t, uint64_t epoch) override { epochs.push_back(epoch); }

 private:
  int64_t n_;
};

// Every index of a pass, in order; `peek` stops after the first batch (`*loader.begin()`).
std::vector<int64_t> pass_order(DataLoader& loader, bool peek = false) {
  std::vector<int64_t> order;
  for (const Batch& b : loader) {
    order.insert(order.end(), b.indices.begin(), b.indices.end());
    if (peek) break;
  }
  return order;
}

// What a pass printed on stderr.
std::string stderr_of(const std::function<void()>& pass) {
  ::testing::internal::CaptureStderr();
  pass();
  return ::testing::internal::GetCapturedStderr();
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

constexpr const char* kRepeatWarning = "call sampler->set_epoch(epoch) before each epoch";

// A sampler whose order is a function of (seed, epoch), as PyTorch's DistributedSampler:
// set_epoch(e), a peek at one batch, then a loop: the loop is epoch e, whatever the workers.
TEST(DataLoader, PeekThenLoopLoadsTheEpochSetEpochSelected) {
  for (int workers : {0, 2}) {
    auto sampler = std::make_shared<RandomWindowSampler>(50, 30, 5);
    DataLoader loader(small_dataset(50),
                      {.batch_size = 4, .num_workers = workers, .sampler = sampler});
    RandomWindowSampler fresh(50, 30, 5);
    for (uint64_t epoch : {3, 4}) {
      sampler->set_epoch(epoch);
      const Batch peeked = *loader.begin();
      EXPECT_EQ(loader.epoch(), epoch);
      const std::vector<int64_t> loop = pass_order(loader);
      fresh.set_epoch(epoch);
      EXPECT_EQ(loop, fresh.indices()) << "epoch " << epoch << ", " << workers << " workers";
      EXPECT_EQ(peeked.indices, std::vector<int64_t>(loop.begin(), loop.begin() + 4));
    }
    EXPECT_EQ(sampler->epoch(), 4u);
  }
}

TEST(DataLoader, PassesWithoutSetEpochRepeatItsOrderAndWarnOnce) {
  auto sampler = std::make_shared<RandomWindowSampler>(40, 40, 8);
  DataLoader loader(small_dataset(40), {.batch_size = 8, .num_workers = 1, .sampler = sampler});
  sampler->set_epoch(2);
  std::vector<int64_t> first, second, third;
  // A partial pass, then one complete pass: no warning yet.
  EXPECT_EQ(stderr_of([&] {
              pass_order(loader, true);
              first = pass_order(loader);
            }),
            "");
  EXPECT_EQ(first, random_window_starts(40, 40, 8, 2));
  // Two more complete passes of epoch 2: the same order, and one warning.
  const std::string said = stderr_of([&] {
    second = pass_order(loader);
    third = pass_order(loader);
  });
  EXPECT_EQ(second, first);
  EXPECT_EQ(third, first);
  EXPECT_EQ(count_of(said, kRepeatWarning), 1u) << said;
  EXPECT_NE(said.find("epoch 2"), std::string::npos) << said;
  // set_epoch() before each pass, as a PyTorch loop does (the same epoch again included):
  // silent.
  EXPECT_EQ(stderr_of([&] {
              for (uint64_t epoch : {3, 3, 4}) {
                sampler->set_epoch(epoch);
                EXPECT_EQ(pass_order(loader), random_window_starts(40, 40, 8, epoch));
              }
            }),
            "");
  // A sampler whose order does not depend on the epoch repeats without a word.
  DataLoader fixed(small_dataset(10),
                   {.batch_size = 2, .sampler = std::make_shared<OddReverseSampler>(10)});
  EXPECT_EQ(stderr_of([&] {
              for (int pass = 0; pass < 3; ++pass)
                EXPECT_EQ(pass_order(fixed), (std::vector<int64_t>{9, 7, 5, 3, 1}));
            }),
            "");
}

// PyTorch's RandomSampler (and a loader's shuffle = true) draws a new order on each
// iteration; ember's is the next epoch of (seed, epoch), so set_epoch() still replays one.
TEST(DataLoader, RandomSamplerAndShuffleDrawANewOrderEachPass) {
  auto sampler = std::make_shared<RandomSampler>(20, 5);
  DataLoader given(small_dataset(20), {.batch_size = 6, .num_workers = 2, .sampler = sampler});
  DataLoader shuffled(small_dataset(20), {.batch_size = 6, .shuffle = true, .seed = 5});
  for (DataLoader* loader : {&given, &shuffled}) {
    EXPECT_EQ(stderr_of([&] {
                EXPECT_EQ(pass_order(*loader), random_permutation(20, 5, 0));
                EXPECT_EQ(pass_order(*loader), random_permutation(20, 5, 1));
                EXPECT_EQ(loader->epoch(), 2u);
                EXPECT_EQ(pass_order(*loader), random_permutation(20, 5, 2));
                // Chosen before a pass (a resumed run's fresh loader, or a replay): that epoch.
                loader->set_epoch(7);
                EXPECT_EQ(loader->epoch(), 7u);
                EXPECT_EQ(pass_order(*loader), random_permutation(20, 5, 7));
                // A peek is an iteration of its own, as in PyTorch: the loop after it moves on.
                loader->set_epoch(3);
                const std::vector<int64_t> third = random_permutation(20, 5, 3);
                EXPECT_EQ(pass_order(*loader, true),
                          std::vector<int64_t>(third.begin(), third.begin() + 6));
                EXPECT_EQ(pass_order(*loader), random_permutation(20, 5, 4));
              }),
              "");  // never a repeat, so never a warning
  }
  // loader.set_epoch() selects the given sampler's epoch: one source of truth.
  given.set_epoch(2);
  EXPECT_EQ(sampler->epoch(), 2u);
  EXPECT_EQ(pass_order(given), random_permutation(20, 5, 2));
}

// A loader without .seed draws its seed from the default generator when it is made, as
// PyTorch's does: manual_seed before it repeats a run, and each unseeded loader (each process)
// shuffles its own way.
TEST(DataLoader, WithoutASeedShufflesFromTheDefaultGenerator) {
  manual_seed(11);
  DataLoader first(small_dataset(50), {.batch_size = 50, .shuffle = true});
  DataLoader second(small_dataset(50), {.batch_size = 50, .shuffle = true});
  manual_seed(11);
  DataLoader replay(small_dataset(50), {.batch_size = 50, .shuffle = true});
  EXPECT_NE(first.seed(), second.seed());
  EXPECT_EQ(replay.seed(), first.seed());
  const std::vector<int64_t> order = pass_order(first);
  EXPECT_NE(pass_order(second), order);
  EXPECT_EQ(pass_order(replay), order);
  EXPECT_EQ(order, random_permutation(50, first.seed(), 0));
  DataLoader seeded(small_dataset(50), {.batch_size = 50, .shuffle = true, .seed = 5});
  EXPECT_EQ(seeded.seed(), 5u);
  EXPECT_EQ(pass_order(seeded), random_permutation(50, 5, 0));
}

TEST(DataLoader, UsesAnySamplerAndSetsItsEpoch) {
  auto sampler = std::make_shared<OddReverseSampler>(10);
  DataLoaderOptions options;
  options.batch_size = 2;
  options.sampler = sampler;
  options.num_workers = 2;
  DataLoader loader(small_dataset(10), options);
  EXPECT_EQ(loader.size(), 3);
  loader.set_epoch(7);
  EXPECT_EQ(pass_order(loader), (std::vector<int64_t>{9, 7, 5, 3, 1}));
  collect(loader);
  EXPECT_EQ(sampler->epochs, (std::vector<uint64_t>{7}));  // the loader moved nothing on
  EXPECT_EQ(loader.epoch(), 7u);
}

TEST(DataLoader, ShuffleTogetherWithASamplerIsRefused) {
  // PyTorch: ValueError: sampler option is mutually exclusive with shuffle.
  EXPECT_EMBER_ERROR(DataLoader(small_dataset(10),
                                {.shuffle = true, .sampler = std::make_shared<RandomSampler>(10)}),
                     "DataLoader: the sampler option is mutually exclusive with shuffle = true");
}

// Throws on one index; counts the examples it produced.
class FailingDataset : public Dataset {
 public:
  FailingDataset(int64_t n, int64_t bad) : n_(n), bad_(bad) {}
  int64_t size() const override { return n_; }
  Example get(int64_t index) const override {
    if (index == bad_) throw std::runtime_error("disk on fire");
    ++produced;
    return {full({3}, static_cast<double>(index)), index};
  }
  mutable std::atomic<int64_t> produced{0};

 private:
  int64_t n_, bad_;
};

TEST(DataLoader, AWorkerErrorReachesTheCallerInOrderWithTheSampleIndex) {
  for (int workers : {0, 1, 3}) {
    DataLoaderOptions options;
    options.batch_size = 4;
    options.num_workers = workers;
    DataLoader loader(std::make_shared<FailingDataset>(40, 13), options);
    std::vector<int64_t> seen;
    try {
      for (const Batch& b : loader) seen.insert(seen.end(), b.indices.begin(), b.indices.end());
      ADD_FAILURE() << "no error with " << workers << " workers";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "DataLoader: sample 13 (batch 3 of epoch 0) failed: disk on fire"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(seen.size(), 12u) << workers << " workers";  // batches 0-2 arrived first
    // The loader is usable again afterwards.
    auto it = loader.begin();
    EXPECT_EQ(it->indices, (std::vector<int64_t>{0, 1, 2, 3}));
  }
}

TEST(DataLoader, BadSamplesAndMismatchedShapesAreReported) {
  auto sampler = std::make_shared<OddReverseSampler>(30);  // indices past a 10-example dataset
  DataLoaderOptions options;
  options.batch_size = 4;
  options.sampler = sampler;
  DataLoader loader(small_dataset(10), options);
  EXPECT_EMBER_ERROR(loader.begin(),
                     "sample 29 (batch 0 of epoch 0) failed: sampler: index is out of range for a "
                     "dataset of 10 examples");

  // Images of two sizes cannot share a batch without a resize.
  auto mixed = std::make_shared<TensorDataset>(zeros({4, 6}, kU8),
                                               from_vector(std::vector<int64_t>{0, 1, 2, 3}));
  class Varying : public Dataset {
   public:
    int64_t size() const override { return 2; }
    Example get(int64_t index) const override { return {zeros({index + 1, 2}), 0}; }
  };
  DataLoaderOptions two;
  two.batch_size = 2;
  DataLoader varying(std::make_shared<Varying>(), two);
  EXPECT_EMBER_ERROR(
      varying.begin(),
      "sample 1 (batch 0 of epoch 0) failed: collate: its data (index 1) is f32 [2, 2] but "
      "the batch's first sample (index 0) is f32 [1, 2]");
  EXPECT_EMBER_ERROR(DataLoader(mixed, {.batch_size = 0}), "batch_size must be >= 1, got 0");
  EXPECT_EMBER_ERROR(DataLoader(mixed, {.num_workers = -1}), "num_workers must be >= 0");
  EXPECT_EMBER_ERROR(DataLoader(nullptr), "dataset is null");
}

// Slow examples, so that a loader is always mid-batch when the test abandons it; counts
// the examples it produced.
class SlowDataset : public Dataset {
 public:
  int64_t size() const override { return 100000; }
  Example get(int64_t index) const override {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    ++produced;
    return {full({4}, static_cast<double>(index)), index};
  }
  mutable std::atomic<int64_t> produced{0};
};

TEST(DataLoader, DestructionAndRestartMidEpochStopTheWorkers) {
  DataLoaderOptions options;
  options.batch_size = 16;
  options.num_workers = 3;
  options.prefetch_factor = 4;
  auto ds = std::make_shared<SlowDataset>();
  {
    DataLoader loader(ds, options);
    auto it = loader.begin();
    ++it;
    EXPECT_EQ(it->indices.front(), 16);
    auto again = loader.begin();  // abandons the first epoch
    EXPECT_EQ(again->indices.front(), 0);
    EXPECT_EQ(loader.epoch(), 2u);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let the workers fill up
  }  // destroyed with workers mid-batch: they stop and are joined
  const int64_t produced = ds->produced;
  // Each epoch loads at most the batches in the prefetch window (3 workers x 4, plus the
  // ones taken), far short of the 100,000-example epoch.
  EXPECT_LE(produced, 2 * (3 * 4 + 2) * 16);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(ds->produced, produced);  // no thread outlived the loader
}

TEST(DataLoader, FashionMnistEndToEnd) {
  if (!std::filesystem::exists(std::string(FashionMnist::kDefaultRoot) +
                               "/t10k-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "apt-get install dataset-fashion-mnist";
  // The README's example, on the test split.
  auto test = std::make_shared<FashionMnist>(Split::kTest);
  DataLoader loader(test, {.batch_size = 128,
                           .shuffle = true,
                           .seed = 1,
                           .num_workers = 2,
                           .transform = std::make_shared<ToTensor>()});
  EXPECT_EQ(loader.size(), 79);
  int64_t seen = 0;
  std::vector<int64_t> counts(10, 0);
  for (const Batch& batch : loader) {
    ASSERT_EQ(batch.data.sizes(), (Shape{batch.data.size(0), 1, 28, 28}));
    ASSERT_EQ(batch.data.dtype(), kF32);
    for (int64_t t : batch.target.to_vector<int64_t>()) ++counts[static_cast<size_t>(t)];
    seen += batch.data.size(0);
    if (seen == 128) {
      EXPECT_GE(batch.data.min().item<float>(), 0.0f);
      EXPECT_LE(batch.data.max().item<float>(), 1.0f);
    }
  }
  EXPECT_EQ(seen, 10000);
  EXPECT_EQ(counts, std::vector<int64_t>(10, 1000));
}

TEST(DataLoader, ImageFolderOfMixedSizesBatchesAfterResizeAndCenterCrop) {
  testing::TempDir dir;
  const std::vector<std::pair<int, int>> sizes = {{12, 20}, {9, 9}, {30, 16}, {8, 8}, {17, 11}};
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto [w, h] = sizes[i];
    testing::Bytes hwc(static_cast<size_t>(w * h * 3), static_cast<uint8_t>(40 * i));
    dir.write((i % 2 ? "b/" : "a/") + std::to_string(i) + ".png", testing::png(w, h, 3, hwc));
  }
  auto folder = std::make_shared<ImageFolder>(dir.path());
  DataLoaderOptions options;
  options.batch_size = 2;
  options.num_workers = 2;
  DataLoader raw(folder, options);
  EXPECT_EMBER_ERROR(raw.begin(), "transform them to one size (e.g. Resize, CenterCrop)");

  options.transform = std::make_shared<Compose>(std::vector<std::shared_ptr<const Transform>>{
      std::make_shared<Resize>(8), std::make_shared<CenterCrop>(8, 8),
      std::make_shared<ToTensor>()});
  DataLoader loader(folder, options);
  std::vector<int64_t> targets;
  for (const Batch& b : loader) {
    EXPECT_EQ(b.data.sizes(), (Shape{b.data.size(0), 3, 8, 8}));
    for (size_t k = 0; k < b.indices.size(); ++k) {
      // Each image is one flat colour, which resizing and cropping keep.
      const auto path = folder->samples()[static_cast<size_t>(b.indices[k])].first;
      const int i = std::stoi(std::filesystem::path(path).stem().string());
      EXPECT_TRUE(
          allclose(b.data.select(0, static_cast<int64_t>(k)), full({3, 8, 8}, (40.0 * i) / 255.0)))
          << path;
    }
    const auto t = b.target.to_vector<int64_t>();
    targets.insert(targets.end(), t.begin(), t.end());
  }
  EXPECT_EQ(targets, (std::vector<int64_t>{0, 0, 0, 1, 1}));  // a: 0, 2, 4; b: 1, 3
}

TEST(DataLoader, PinsBatchesOnlyWhenCudaIsPresent) {
  DataLoaderOptions options;
  options.batch_size = 5;
  options.pin_memory = true;
  options.num_workers = 1;
  DataLoader loader(small_dataset(10), options);
  for (const Batch& b : loader) {
    EXPECT_EQ(b.data.is_pinned(), cuda::is_available());
    EXPECT_EQ(b.target.is_pinned(), cuda::is_available());
  }
}

TEST(DataLoader, PinnedBatchesCopyToTheGpu) {
  EMBER_REQUIRE_CUDA();
  DataLoaderOptions options;
  options.batch_size = 4;
  options.pin_memory = true;
  options.num_workers = 2;
  DataLoader loader(small_dataset(8), options);
  for (const Batch& b : loader) {
    ASSERT_TRUE(b.data.is_pinned());
    const Tensor gpu = b.data.to(cuda_device(0), /*non_blocking=*/true);
    EXPECT_TRUE(equal(gpu.cpu(), b.data));
  }
}

}  // namespace
}  // namespace ember::data
