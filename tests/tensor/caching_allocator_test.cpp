// The caching allocator's core against a fake device: malloc-backed memory with a capacity
// and call counters, and events whose completion the test decides.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <ember/tensor/detail/caching_allocator.h>
#include <ember/tensor/error.h>

namespace ember::detail {
namespace {

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * 1024;

// What the fake device saw; shared with the test because the allocator owns the device.
struct FakeDeviceState {
  size_t capacity = size_t{1} << 40;
  size_t in_use = 0;
  int raw_allocs = 0;
  int raw_frees = 0;
  int failed_allocs = 0;
  std::unordered_map<void*, size_t> blocks;
  // Events: which stream each was recorded on and whether it has completed.
  struct FakeEvent {
    void* stream;
    bool done = false;
  };
  std::vector<std::unique_ptr<FakeEvent>> events;
  int live_events = 0;

  void complete_events() {
    for (auto& e : events) e->done = true;
  }
};

class FakeDeviceMemory : public DeviceMemory {
 public:
  explicit FakeDeviceMemory(std::shared_ptr<FakeDeviceState> state) : state_(std::move(state)) {}

  void* raw_alloc(size_t nbytes) override {
    if (state_->in_use + nbytes > state_->capacity) {
      ++state_->failed_allocs;
      return nullptr;
    }
    void* ptr = std::malloc(nbytes);
    state_->in_use += nbytes;
    state_->blocks[ptr] = nbytes;
    ++state_->raw_allocs;
    return ptr;
  }
  void raw_free(void* ptr) override {
    auto it = state_->blocks.find(ptr);
    ASSERT_NE(it, state_->blocks.end()) << "raw_free of a pointer raw_alloc did not return";
    state_->in_use -= it->second;
    state_->blocks.erase(it);
    ++state_->raw_frees;
    std::free(ptr);
  }
  void* record_event(void* stream) override {
    state_->events.push_back(std::make_unique<FakeDeviceState::FakeEvent>());
    state_->events.back()->stream = stream;
    ++state_->live_events;
    return state_->events.back().get();
  }
  bool event_done(void* event) override {
    return static_cast<FakeDeviceState::FakeEvent*>(event)->done;
  }
  void destroy_event(void*) override { --state_->live_events; }

 private:
  std::shared_ptr<FakeDeviceState> state_;
};

class CachingAllocatorTest : public ::testing::Test {
 protected:
  CachingAllocatorTest()
      : device_(std::make_shared<FakeDeviceState>()),
        allocator_(
            std::make_unique<CachingAllocator>(std::make_unique<FakeDeviceMemory>(device_))) {}

  std::shared_ptr<FakeDeviceState> device_;
  std::unique_ptr<CachingAllocator> allocator_;
  void* const stream1_ = reinterpret_cast<void*>(0x1000);
  void* const stream2_ = reinterpret_cast<void*>(0x2000);
};

// One "training step": a mix of small and large tensors, some freed early, all freed at the end.
void training_step(CachingAllocator& allocator, void* stream) {
  std::vector<void*> live;
  for (size_t bytes : {size_t{4}, 3 * kKiB, 100 * kKiB, kMiB, 3 * kMiB, 12 * kMiB + 5}) {
    live.push_back(allocator.allocate(bytes, stream));
  }
  allocator.free(live[1]);
  allocator.free(live[4]);
  live.push_back(allocator.allocate(600 * kKiB, stream));
  live.push_back(allocator.allocate(25 * kMiB, stream));
  for (void* ptr : live) {
    if (ptr != live[1] && ptr != live[4]) allocator.free(ptr);
  }
}

TEST_F(CachingAllocatorTest, SecondIdenticalStepMakesNoRawAllocation) {
  training_step(*allocator_, stream1_);
  const int first_step_allocs = device_->raw_allocs;
  EXPECT_GT(first_step_allocs, 0);
  EXPECT_EQ(allocator_->stats().allocated_bytes, 0u);
  for (int step = 0; step < 3; ++step) training_step(*allocator_, stream1_);
  EXPECT_EQ(device_->raw_allocs, first_step_allocs);
  EXPECT_EQ(device_->raw_frees, 0);
  EXPECT_EQ(allocator_->stats().num_device_allocs, static_cast<uint64_t>(first_step_allocs));
}

TEST_F(CachingAllocatorTest, SizesRoundUpTo512Bytes) {
  void* a = allocator_->allocate(1, stream1_);
  void* b = allocator_->allocate(513, stream1_);
  void* c = allocator_->allocate(0, stream1_);
  EXPECT_NE(a, c);
  EXPECT_EQ(allocator_->stats().allocated_bytes, 512u + 1024u + 512u);
  // Small blocks are carved one after another from a single 2 MiB segment.
  EXPECT_EQ(static_cast<char*>(b), static_cast<char*>(a) + 512);
  EXPECT_EQ(device_->raw_allocs, 1);
  EXPECT_EQ(allocator_->stats().reserved_bytes, 2 * kMiB);
  allocator_->free(a);
  allocator_->free(b);
  allocator_->free(c);
}

TEST_F(CachingAllocatorTest, LargeSegmentSizes) {
  void* medium = allocator_->allocate(3 * kMiB, stream1_);  // shares a 20 MiB segment
  EXPECT_EQ(allocator_->stats().reserved_bytes, 20 * kMiB);
  void* medium2 = allocator_->allocate(5 * kMiB, stream1_);
  EXPECT_EQ(device_->raw_allocs, 1);
  // 12 MiB of the first segment are left; 13 MiB needs its own segment, rounded to 14 MiB.
  void* big = allocator_->allocate(13 * kMiB + 1, stream1_);
  EXPECT_EQ(allocator_->stats().reserved_bytes, 34 * kMiB);
  EXPECT_EQ(device_->raw_allocs, 2);
  for (void* p : {medium, medium2, big}) allocator_->free(p);
}

TEST_F(CachingAllocatorTest, SplitHalvesMergeBackIntoOneBlock) {
  void* whole = allocator_->allocate(12 * kMiB, stream1_);
  allocator_->free(whole);
  void* first = allocator_->allocate(6 * kMiB, stream1_);
  void* second = allocator_->allocate(6 * kMiB, stream1_);
  EXPECT_EQ(first, whole);
  EXPECT_EQ(static_cast<char*>(second), static_cast<char*>(first) + 6 * kMiB);
  EXPECT_EQ(device_->raw_allocs, 1);
  allocator_->free(second);
  allocator_->free(first);
  // Both halves merged: the full-size request is served without a raw allocation.
  void* again = allocator_->allocate(12 * kMiB, stream1_);
  EXPECT_EQ(again, whole);
  EXPECT_EQ(device_->raw_allocs, 1);
  allocator_->free(again);
}

TEST_F(CachingAllocatorTest, SmallPoolMergesNeighboursFreedInAnyOrder) {
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(allocator_->allocate(512 * kKiB, stream1_));
  EXPECT_EQ(device_->raw_allocs, 1);  // four 512 KiB blocks fill one 2 MiB segment
  for (int i : {2, 0, 3, 1}) allocator_->free(blocks[i]);
  // The whole segment is one free block again, so empty_cache can release it.
  allocator_->empty_cache();
  EXPECT_EQ(device_->raw_frees, 1);
  EXPECT_EQ(allocator_->stats().reserved_bytes, 0u);
}

TEST_F(CachingAllocatorTest, LargeRemainderOfAtMostOneMiBIsNotSplit) {
  void* whole = allocator_->allocate(12 * kMiB, stream1_);
  allocator_->free(whole);
  // 12 MiB - 11.5 MiB leaves 512 KiB: too little to keep, so the request gets the whole block.
  void* most = allocator_->allocate(11 * kMiB + 512 * kKiB, stream1_);
  EXPECT_EQ(most, whole);
  EXPECT_EQ(allocator_->stats().allocated_bytes, 12 * kMiB);
  allocator_->free(most);
}

TEST_F(CachingAllocatorTest, StreamsDoNotShareCachedBlocks) {
  void* a = allocator_->allocate(64 * kKiB, stream1_);
  allocator_->free(a);
  void* b = allocator_->allocate(64 * kKiB, stream2_);
  EXPECT_NE(b, a);
  EXPECT_EQ(device_->raw_allocs, 2);
  void* c = allocator_->allocate(64 * kKiB, stream1_);
  EXPECT_EQ(c, a);
  EXPECT_EQ(device_->raw_allocs, 2);
  allocator_->free(b);
  allocator_->free(c);
}

TEST_F(CachingAllocatorTest, RecordStreamDefersReuseUntilEventsComplete) {
  void* a = allocator_->allocate(12 * kMiB, stream1_);
  EXPECT_TRUE(allocator_->record_stream(a, stream2_));
  EXPECT_TRUE(allocator_->record_stream(a, stream1_));  // its own stream: nothing to wait for
  allocator_->free(a);
  ASSERT_EQ(device_->events.size(), 1u);
  EXPECT_EQ(device_->events[0]->stream, stream2_);
  EXPECT_EQ(allocator_->stats().allocated_bytes, 0u);

  // stream2's work may still use a: a new request must not get it.
  void* b = allocator_->allocate(12 * kMiB, stream1_);
  EXPECT_NE(b, a);
  EXPECT_EQ(device_->raw_allocs, 2);
  allocator_->free(b);

  device_->complete_events();
  void* c = allocator_->allocate(12 * kMiB, stream1_);
  void* d = allocator_->allocate(12 * kMiB, stream1_);
  EXPECT_TRUE((c == a && d == b) || (c == b && d == a));
  EXPECT_EQ(device_->raw_allocs, 2);
  EXPECT_EQ(device_->live_events, 0);
  allocator_->free(c);
  allocator_->free(d);
}

TEST_F(CachingAllocatorTest, BlockUsedOnTwoStreamsWaitsForBoth) {
  void* const stream3 = reinterpret_cast<void*>(0x3000);
  void* a = allocator_->allocate(kKiB, stream1_);
  allocator_->record_stream(a, stream2_);
  allocator_->record_stream(a, stream3);
  allocator_->free(a);
  ASSERT_EQ(device_->events.size(), 2u);
  device_->events[0]->done = true;
  allocator_->empty_cache();  // polls events: one is still pending, so the segment stays
  EXPECT_EQ(device_->raw_frees, 0);
  EXPECT_EQ(device_->live_events, 1);
  device_->events[1]->done = true;
  allocator_->empty_cache();
  EXPECT_EQ(device_->raw_frees, 1);
  EXPECT_EQ(device_->live_events, 0);
}

TEST_F(CachingAllocatorTest, EmptyCacheReleasesOnlySegmentsWithoutLiveBlocks) {
  void* small_live = allocator_->allocate(kKiB, stream1_);
  void* small_freed = allocator_->allocate(kKiB, stream1_);  // same segment as small_live
  void* large_freed = allocator_->allocate(16 * kMiB, stream1_);
  void* other_stream = allocator_->allocate(kKiB, stream2_);
  allocator_->free(small_freed);
  allocator_->free(large_freed);
  allocator_->free(other_stream);
  EXPECT_EQ(allocator_->stats().reserved_bytes, 2 * kMiB + 16 * kMiB + 2 * kMiB);

  allocator_->empty_cache();
  EXPECT_EQ(device_->raw_frees, 2);
  EXPECT_EQ(allocator_->stats().reserved_bytes, 2 * kMiB);
  EXPECT_EQ(allocator_->stats().num_device_frees, 2u);

  allocator_->free(small_live);
  allocator_->empty_cache();
  EXPECT_EQ(device_->raw_frees, 3);
  EXPECT_EQ(allocator_->stats().reserved_bytes, 0u);
  EXPECT_EQ(device_->in_use, 0u);
}

TEST_F(CachingAllocatorTest, StatsTrackAllocatedReservedAndPeaks) {
  void* a = allocator_->allocate(12 * kMiB, stream1_);
  void* b = allocator_->allocate(100 * kKiB, stream1_);
  auto stats = allocator_->stats();
  EXPECT_EQ(stats.allocated_bytes, 12 * kMiB + 100 * kKiB);
  EXPECT_EQ(stats.reserved_bytes, 12 * kMiB + 2 * kMiB);
  EXPECT_EQ(stats.num_device_allocs, 2u);

  allocator_->free(a);
  stats = allocator_->stats();
  EXPECT_EQ(stats.allocated_bytes, 100 * kKiB);
  EXPECT_EQ(stats.reserved_bytes, 14 * kMiB);  // cached, not returned
  EXPECT_EQ(stats.peak_allocated_bytes, 12 * kMiB + 100 * kKiB);
  EXPECT_EQ(stats.peak_reserved_bytes, 14 * kMiB);

  allocator_->reset_peak_stats();
  stats = allocator_->stats();
  EXPECT_EQ(stats.peak_allocated_bytes, 100 * kKiB);
  EXPECT_EQ(stats.peak_reserved_bytes, 14 * kMiB);
  allocator_->empty_cache();
  stats = allocator_->stats();
  EXPECT_EQ(stats.reserved_bytes, 2 * kMiB);
  EXPECT_EQ(stats.peak_reserved_bytes, 14 * kMiB);
  EXPECT_EQ(stats.num_device_frees, 1u);
  allocator_->free(b);
}

TEST_F(CachingAllocatorTest, OutOfMemoryReleasesCacheAndRetriesOnce) {
  device_->capacity = 40 * kMiB;
  void* a = allocator_->allocate(20 * kMiB, stream1_);
  void* b = allocator_->allocate(16 * kMiB, stream2_);
  allocator_->free(b);  // cached on stream2, useless for stream1

  // 20 + 16 + 18 > 40: the first raw allocation fails, the cache is released, the retry fits.
  void* c = allocator_->allocate(18 * kMiB, stream1_);
  EXPECT_NE(c, nullptr);
  EXPECT_EQ(device_->failed_allocs, 1);
  EXPECT_EQ(device_->raw_frees, 1);
  EXPECT_EQ(allocator_->stats().reserved_bytes, 38 * kMiB);

  try {
    allocator_->allocate(30 * kMiB, stream1_);
    ADD_FAILURE() << "expected an out-of-memory error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "CUDA out of memory: tried to allocate 30.00 MiB (allocated 38.00 MiB, "
                 "reserved 38.00 MiB)");
  }
  EXPECT_EQ(device_->failed_allocs, 3);  // one try, one retry
  // The allocator is still usable after the error.
  allocator_->free(a);
  void* d = allocator_->allocate(20 * kMiB, stream1_);
  EXPECT_EQ(d, a);
  allocator_->free(c);
  allocator_->free(d);
}

TEST_F(CachingAllocatorTest, FreeingUnknownPointerIsAnInternalError) {
  int not_from_allocator = 0;
  EXPECT_THROW(allocator_->free(&not_from_allocator), InternalError);
  void* a = allocator_->allocate(kKiB, stream1_);
  allocator_->free(a);
  EXPECT_THROW(allocator_->free(a), InternalError);  // double free
}

TEST_F(CachingAllocatorTest, RecordStreamOnMemoryItDoesNotOwnRecordsNothing) {
  int not_from_allocator = 0;
  EXPECT_FALSE(allocator_->record_stream(&not_from_allocator, stream2_));
  // Nor inside one of its blocks: a block is named by its start.
  void* a = allocator_->allocate(kKiB, stream1_);
  EXPECT_FALSE(allocator_->record_stream(static_cast<char*>(a) + 256, stream2_));
  allocator_->free(a);
  EXPECT_TRUE(device_->events.empty());  // nothing recorded: the free waits for no stream
}

TEST_F(CachingAllocatorTest, DestructionReturnsEveryCachedSegment) {
  training_step(*allocator_, stream1_);
  void* a = allocator_->allocate(kKiB, stream2_);
  allocator_->record_stream(a, stream1_);
  allocator_->free(a);  // still waiting for its event
  EXPECT_GT(device_->in_use, 0u);
  allocator_.reset();
  EXPECT_EQ(device_->in_use, 0u);
  EXPECT_EQ(device_->raw_frees, device_->raw_allocs);
  EXPECT_EQ(device_->live_events, 0);
}

TEST_F(CachingAllocatorTest, ConcurrentThreadsKeepConsistentState) {
  auto worker = [&](void* stream, size_t base) {
    for (int i = 0; i < 2000; ++i) {
      const size_t bytes = base + static_cast<size_t>(i % 7) * 300 * kKiB;
      void* p = allocator_->allocate(bytes, stream);
      void* q = allocator_->allocate(bytes / 3 + 1, stream);
      allocator_->free(p);
      allocator_->free(q);
    }
  };
  std::thread t1(worker, stream1_, 1000);
  std::thread t2(worker, stream2_, 2 * kMiB);
  worker(stream1_, 5000);
  t1.join();
  t2.join();
  EXPECT_EQ(allocator_->stats().allocated_bytes, 0u);
  allocator_->empty_cache();
  EXPECT_EQ(allocator_->stats().reserved_bytes, 0u);
  EXPECT_EQ(device_->in_use, 0u);
}

// --- private pools (CUDA graphs) ----------------------------------------------------------

// What a capture of training_step leaves: its blocks freed inside the pool, one kept (an
// output the graph writes, like a gradient).
void* captured_step(CachingAllocator& allocator, void* stream) {
  training_step(allocator, stream);
  return allocator.allocate(3 * kMiB, stream);
}

TEST_F(CachingAllocatorTest, CaptureAfterWarmUpTakesCachedSegmentsWithoutRawAllocation) {
  training_step(*allocator_, stream1_);  // warm-up on the main stream fills the cache
  const int warm = device_->raw_allocs;
  const size_t reserved = allocator_->stats().reserved_bytes;
  allocator_->begin_pool(1, stream2_);
  void* output = captured_step(*allocator_, stream2_);
  allocator_->end_pool(stream2_);
  EXPECT_EQ(device_->raw_allocs, warm);
  EXPECT_EQ(allocator_->stats().reserved_bytes, reserved);
  allocator_->free(output);
  allocator_->release_pool(1, stream1_);
  training_step(*allocator_, stream1_);  // everything came back to the main stream's cache
  EXPECT_EQ(device_->raw_allocs, warm);
}

TEST_F(CachingAllocatorTest, PoolBlocksAreNeverHandedOutsideThePoolWhileItLives) {
  allocator_->begin_pool(7, stream1_);
  void* captured = allocator_->allocate(64 * kKiB, stream1_);
  allocator_->free(captured);
  void* again = allocator_->allocate(64 * kKiB, stream1_);  // reuse inside the capture
  EXPECT_EQ(again, captured);
  allocator_->end_pool(stream1_);
  const int allocs = device_->raw_allocs;
  allocator_->free(again);
  // The same stream outside the capture, and a whole-segment request: neither takes it.
  void* eager = allocator_->allocate(64 * kKiB, stream1_);
  EXPECT_NE(eager, again);
  EXPECT_EQ(device_->raw_allocs, allocs + 1);
  allocator_->empty_cache();  // the pool's segment is the graph's: not released
  EXPECT_EQ(device_->raw_frees, 0);
  // A second capture into the same pool finds its freed block.
  allocator_->begin_pool(7, stream1_);
  EXPECT_EQ(allocator_->allocate(64 * kKiB, stream1_), again);
  allocator_->end_pool(stream1_);
  allocator_->free(again);
  allocator_->free(eager);
}

TEST_F(CachingAllocatorTest, ReleasedPoolReturnsLiveBlocksWhenTheyAreFreed) {
  allocator_->begin_pool(3, stream2_);
  void* kept = allocator_->allocate(12 * kMiB, stream2_);
  void* gone = allocator_->allocate(kKiB, stream2_);
  allocator_->end_pool(stream2_);
  allocator_->free(gone);
  allocator_->release_pool(3, stream1_);
  const int allocs = device_->raw_allocs;
  // The small segment came back at once; the large one is still in use.
  EXPECT_EQ(allocator_->allocate(kKiB, stream1_), gone);
  allocator_->free(kept);
  EXPECT_EQ(allocator_->allocate(12 * kMiB, stream1_), kept);
  EXPECT_EQ(device_->raw_allocs, allocs);
  allocator_->free(gone);
  allocator_->free(kept);
  allocator_->empty_cache();
  EXPECT_EQ(device_->in_use, 0u);
}

TEST_F(CachingAllocatorTest, OutOfMemoryDuringCaptureFreesNothing) {
  void* cached = allocator_->allocate(12 * kMiB, stream1_);
  allocator_->free(cached);
  device_->capacity = device_->in_use;  // full
  allocator_->begin_pool(2, stream2_);
  EXPECT_NO_THROW(allocator_->free(allocator_->allocate(12 * kMiB, stream2_)));  // adopted
  EXPECT_THROW(allocator_->allocate(30 * kMiB, stream2_), Error);
  EXPECT_EQ(device_->raw_frees, 0);  // device memory is not freed while capturing
  allocator_->end_pool(stream2_);
  allocator_->release_pool(2, stream1_);
  allocator_->empty_cache();
  EXPECT_EQ(device_->in_use, 0u);
}

TEST_F(CachingAllocatorTest, DestructionWithALivePoolReturnsItsSegments) {
  allocator_->begin_pool(5, stream1_);
  allocator_->free(allocator_->allocate(kMiB, stream1_));
  allocator_->end_pool(stream1_);
  allocator_.reset();
  EXPECT_EQ(device_->in_use, 0u);
}

}  // namespace
}  // namespace ember::detail
