#include "dataloader.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>

#include <ember/tensor/cuda.h>
#include <ember/tensor/error.h>
#include <ember/tensor/ops.h>
#include <ember/tensor/random.h>

namespace ember::data {

// Batch data buffers handed out again once the caller has dropped every tensor viewing
// them: fresh multi-megabyte buffers cost a page fault per 4 KiB on first touch.
// NOTE: a storage whose use_count() is 1 is referenced by the pool alone, and only the pool
// (under its mutex) hands out new references, so nobody else can be reading or writing it.
// Pageable memory only: pinned batches come from the pinned allocator, whose cache hands a
// block out again only once the non_blocking copies that read it have finished.
struct DataLoader::BufferPool {
  std::mutex mutex;
  std::vector<Storage> buffers;
  size_t capacity = 0;

  Tensor acquire(const Shape& shape, DType dtype) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    const size_t nbytes = static_cast<size_t>(numel) * element_size(dtype);
    Shape strides(shape.size(), 1);
    for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
    std::lock_guard<std::mutex> lock(mutex);
    for (const Storage& s : buffers) {
      if (s.use_count() == 1 && s.nbytes() == nbytes) {
        std::atomic_thread_fence(std::memory_order_acquire);  // the last user's accesses
        return Tensor(s, dtype, shape, strides);
      }
    }
    Storage fresh(nbytes, kCPU);
    if (buffers.size() < capacity) buffers.push_back(fresh);
    return Tensor(std::move(fresh), dtype, shape, strides);
  }
};

// One epoch in flight: its sampler order, the worker threads and the batches they have
// finished but the caller has not taken yet.
struct DataLoader::Run {
  struct Slot {
    Batch batch;
    std::exception_ptr error;
  };

  const DataLoader& loader;
  const uint64_t epoch;
  const uint64_t selections;  // the sampler's epoch_selections() as the pass started
  const std::vector<int64_t> order;
  const int64_t num_batches;
  const int64_t window;  // batches that may be claimed beyond the next one to take

  std::mutex mutex;
  std::condition_variable work_cv;   // a worker may claim another batch, or must stop
  std::condition_variable ready_cv;  // a batch was finished
  int64_t next_claim = 0;            // guarded by mutex
  int64_t next_take = 0;             // guarded by mutex
  bool complete = false;             // every batch was taken (by the caller's thread)
  bool stopping = false;             // guarded by mutex
  std::atomic<bool> stop{false};     // the same, read without the lock inside a batch
  std::map<int64_t, Slot> ready;     // guarded by mutex
  std::vector<std::thread> workers;

  Run(const DataLoader& owner, uint64_t epoch_in, uint64_t selections_in,
      std::vector<int64_t> order_in)
      : loader(owner),
        epoch(epoch_in),
        selections(selections_in),
        order(std::move(order_in)),
        num_batches(owner.batches_for(static_cast<int64_t>(order.size()))),
        window(static_cast<int64_t>(owner.options_.num_workers) * owner.options_.prefetch_factor) {
    for (int w = 0; w < owner.options_.num_workers; ++w) workers.emplace_back([this] { work(); });
  }

  ~Run() {
    halt();
    for (auto& t : workers) t.join();
  }

  void halt() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
      stop = true;
    }
    work_cv.notify_all();
  }

  void work() {
    for (;;) {
      int64_t batch = 0;
      {
        std::unique_lock<std::mutex> lock(mutex);
        // NOTE: batches are claimed in increasing order and the window always admits
        // next_take, so the batch the caller waits for is always being loaded.
        work_cv.wait(lock, [&] {
          return stopping || next_claim >= num_batches || next_claim < next_take + window;
        });
        if (stopping || next_claim >= num_batches) return;
        batch = next_claim++;
      }
      Slot slot;
      try {
        slot.batch = loader.load_batch(epoch, order, batch, &stop);
      } catch (...) {
        slot.error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        ready.emplace(batch, std::move(slot));
      }
      ready_cv.notify_all();
    }
  }

  bool finished() {
    complete = true;
    return false;
  }

  // The next batch in order, or false at the end of the epoch; rethrows a loading error.
  bool next(Batch& out) {
    if (workers.empty()) {
      if (next_take >= num_batches) return finished();
      out = loader.load_batch(epoch, order, next_take++, nullptr);
      return true;
    }
    Slot slot;
    {
      std::unique_lock<std::mutex> lock(mutex);
      if (stopping) return false;
      if (next_take >= num_batches) return finished();
      ready_cv.wait(lock, [&] { return ready.count(next_take) > 0; });
      auto it = ready.find(next_take);
      slot = std::move(it->second);
      ready.erase(it);
      ++next_take;
    }
    work_cv.notify_all();
    if (slot.error) {
      halt();
      std::rethrow_exception(slot.error);
    }
    out = std::move(slot.batch);
    return true;
  }
};

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  EMBER_CHECK(dataset_ != nullptr, "DataLoader", "dataset is null");
  EMBER_CHECK(options_.batch_size >= 1, "DataLoader", "batch_size must be >= 1, got ",
              options_.batch_size);
  EMBER_CHECK(options_.num_workers >= 0, "DataLoader", "num_workers must be >= 0, got ",
              options_.num_workers);
  EMBER_CHECK(options_.prefetch_factor >= 1, "DataLoader", "prefetch_factor must be >= 1, got ",
              options_.prefetch_factor);
  EMBER_CHECK(!(options_.shuffle && options_.sampler), "DataLoader",
              "the sampler option is mutually exclusive with shuffle = true: the sampler decides ",
              "the order (give it a shuffling sampler, or drop the sampler to shuffle)");
  // A 62-bit draw: randint's bounds must be exact as doubles.
  seed_ = options_.seed ? *options_.seed
                        : static_cast<uint64_t>(randint(0, int64_t{1} << 62, {}).item<int64_t>());
  if (options_.sampler)
    sampler_ = options_.sampler;
  else if (options_.shuffle)
    sampler_ = std::make_shared<RandomSampler>(dataset_->size(), seed_);
  else
    sampler_ = std::make_shared<SequentialSampler>(dataset_->size());
  pool_ = std::make_unique<BufferPool>();
  // Batches in flight, one being built per worker, and the two the caller may hold.
  pool_->capacity = static_cast<size_t>(options_.num_workers) * (options_.prefetch_factor + 1) + 2;
}

DataLoader::~DataLoader() = default;

int64_t DataLoader::batches_for(int64_t samples) const {
  const int64_t b = options_.batch_size;
  return options_.drop_last ? samples / b : (samples + b - 1) / b;
}

int64_t DataLoader::size() const { return batches_for(sampler_->size()); }

void DataLoader::set_epoch(uint64_t epoch) { sampler_->set_epoch(epoch); }

uint64_t DataLoader::epoch() const { return sampler_->next_pass_epoch(); }

DataLoader::Iterator DataLoader::begin() {
  if (run_ && run_->complete) whole_pass_selection_ = run_->selections;
  run_.reset();  // joins the workers of an epoch still in flight
  Sampler& sampler = *sampler_;
  std::vector<int64_t> order = sampler.start_pass();
  if (whole_pass_selection_ == sampler.epoch_selections() && sampler.shuffles() &&
      !warned_repeat_) {
    warned_repeat_ = true;
    if (sampler.reports_warnings()) {
      std::fprintf(stderr,
                   "ember: DataLoader: another pass over epoch %llu of the sampler, with the "
                   "same order (and random transforms) as its last complete pass: set_epoch() "
                   "was not called since. As in PyTorch, passes repeat the epoch that "
                   "set_epoch() selected; call sampler->set_epoch(epoch) before each epoch. "
                   "(Said once per loader.)\n",
                   static_cast<unsigned long long>(sampler.epoch()));
      std::fflush(stderr);
    }
  }
  run_ =
      std::make_unique<Run>(*this, sampler.epoch(), sampler.epoch_selections(), std::move(order));
  return Iterator(run_.get());
}

namespace {

// One field of a batch (the data, or tensor targets) stacked into [count, ...]: the first
// sample fixes its shape and dtype, and every other sample must match them.
struct StackedField {
  const char* what;  // "data" or "target"
  const Dataset& dataset;
  Tensor batch{};
  Shape sample_shape{};
  size_t sample_bytes = 0;
  int64_t first_index = -1;

  // "index 3" or "index 3, 'cat/a.png'" when the dataset names its examples' sources.
  std::string name(int64_t index) const {
    const std::string source = dataset.describe(index);
    return ember::detail::str_cat("index ", index, source.empty() ? "" : ", '", source,
                                  source.empty() ? "" : "'");
  }

  template <typename Allocate>
  void put(int64_t k, int64_t index, const Tensor& sample, Allocate&& allocate) {
    EMBER_CHECK(sample.defined(), "dataset", "returned an undefined ", what, " tensor");
    if (!batch.defined()) {
      batch = allocate(sample.sizes(), sample.dtype());
      first_index = index;
      sample_shape = sample.sizes();
      sample_bytes = sample.nbytes();
    } else {
      EMBER_CHECK(sample.sizes() == sample_shape && sample.dtype() == batch.dtype(), "collate",
                  "its ", what, " (", name(index), ") is ", sample.dtype(), " ",
                  shape_str(sample.sizes()), " but the batch's first sample (", name(first_index),
                  ") is ", batch.dtype(), " ", shape_str(sample_shape),
                  std::string_view(what) == "data"
                      ? "; transform them to one size (e.g. Resize, CenterCrop)"
                      : "");
    }
    if (sample.is_cpu() && sample.is_contiguous()) {
      if (sample_bytes > 0) {
        std::memcpy(static_cast<char*>(batch.data_ptr()) + k * sample_bytes, sample.data_ptr(),
                    sample_bytes);
      }
    } else {
      batch.select(0, k).copy_(sample);
    }
  }
};

}  // namespace

Batch DataLoader::load_batch(uint64_t epoch, const std::vector<int64_t>& order, int64_t batch,
                             const std::atomic<bool>* stop) const {
  const int64_t first = batch * options_.batch_size;
  const int64_t count =
      std::min<int64_t>(options_.batch_size, static_cast<int64_t>(order.size()) - first);
  // NOTE: pinned batches are not pooled here: after the caller drops a batch, a non_blocking
  // copy to the GPU may still be reading it, which only the pinned allocator knows.
  const bool pinned = options_.pin_memory && cuda::is_available();
  auto batch_of = [count](const Shape& sample_shape) {
    Shape shape{count};
    shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
    return shape;
  };
  auto pooled = [&](const Shape& sample_shape, DType dtype) {
    return pinned ? empty(batch_of(sample_shape), TensorOptions(dtype).with_pinned_memory())
                  : pool_->acquire(batch_of(sample_shape), dtype);
  };
  auto fresh = [&](const Shape& sample_shape, DType dtype) {
    return empty(batch_of(sample_shape), TensorOptions(dtype).with_pinned_memory(pinned));
  };

  Batch out;
  out.indices.assign(order.begin() + first, order.begin() + first + count);
  StackedField data{"data", *dataset_}, target_tensors{"target", *dataset_};
  std::vector<int64_t> class_targets;
  class_targets.reserve(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) {
    if (stop != nullptr && stop->load(std::memory_order_relaxed)) break;
    const int64_t index = out.indices[static_cast<size_t>(k)];
    try {
      EMBER_CHECK(index >= 0 && index < dataset_->size(), "sampler",
                  "index is out of range for a dataset of ", dataset_->size(), " examples");
      Example example = dataset_->get(index);
      if (options_.transform) {
        SampleRng rng(seed_, epoch, index);
        example.data = options_.transform->apply(example.data, rng);
      }
      data.put(k, index, example.data, pooled);
      const bool tensor_target = example.target_tensor.defined();
      EMBER_CHECK(k == 0 || tensor_target == target_tensors.batch.defined(), "collate",
                  "its target is ", tensor_target ? "a tensor" : "a class index",
                  " but the batch's first sample (index ", data.first_index, ") has ",
                  tensor_target ? "a class index" : "a tensor");
      if (tensor_target)
        target_tensors.put(k, index, example.target_tensor, fresh);
      else
        class_targets.push_back(example.target);
    } catch (const std::exception& e) {
      throw Error(ember::detail::str_cat("DataLoader: sample ", index, " (batch ", batch,
                                         " of epoch ", epoch, ") failed: ", e.what()));
    }
  }
  out.data = std::move(data.batch);
  if (target_tensors.batch.defined()) {
    out.target = std::move(target_tensors.batch);
  } else {
    out.target = fresh({}, kI64);
    std::copy(class_targets.begin(), class_targets.end(), out.target.data_ptr<int64_t>());
  }
  return out;
}

DataLoader::Iterator::Iterator(Run* run) : run_(run) { ++*this; }

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  EMBER_CHECK(run_ != nullptr, "DataLoader::Iterator", "advanced past the end of the epoch");
  Run* run = run_;
  run_ = nullptr;  // an exception below ends the epoch for this iterator
  if (run->next(batch_)) run_ = run;
  return *this;
}

}  // namespace ember::data
