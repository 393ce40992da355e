#include "caching_allocator.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../error.h"

namespace ember::detail {
namespace {

constexpr size_t kMinBlockSize = 512;                // every size is a multiple of this
constexpr size_t kSmallSize = size_t{1} << 20;       // requests up to 1 MiB use the small pool
constexpr size_t kSmallBuffer = size_t{2} << 20;     // small-pool segments are 2 MiB
constexpr size_t kMinLargeAlloc = size_t{10} << 20;  // below this, share a 20 MiB segment
constexpr size_t kLargeBuffer = size_t{20} << 20;
constexpr size_t kRoundLarge = size_t{2} << 20;  // larger segments round up to 2 MiB

size_t round_up(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

size_t round_size(size_t nbytes) {
  return nbytes < kMinBlockSize ? kMinBlockSize : round_up(nbytes, kMinBlockSize);
}

size_t segment_size(size_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return round_up(size, kRoundLarge);
}

std::string mib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

// A piece of a segment (one raw allocation). Blocks of a segment form a doubly linked list
// in address order and all belong to the stream the segment was allocated for.
struct Block {
  void* stream = nullptr;
  size_t size = 0;
  char* ptr = nullptr;
  bool small = false;
  bool in_use = true;  // handed out, or freed but waiting for other streams' events
  Block* prev = nullptr;
  Block* next = nullptr;
  std::unordered_set<void*> stream_uses;  // other streams that used it (record_stream)
  int pending_events = 0;
  uint64_t pool = 0;  // 0: the general cache; else the private pool (a CUDA graph's) it is in
};

// Free blocks ordered by (stream, size, address): lower_bound finds the best fit on a stream.
struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    const auto sa = reinterpret_cast<uintptr_t>(a->stream);
    const auto sb = reinterpret_cast<uintptr_t>(b->stream);
    if (sa != sb) return sa < sb;
    if (a->size != b->size) return a->size < b->size;
    return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
  }
};
using Pool = std::set<Block*, BlockLess>;

}  // namespace

// A CUDA graph's memory: the segments its capture allocated from, kept apart from the general
// cache while the graph lives.
struct PrivatePool {
  Pool small, large;
  int64_t segments = 0;
  bool released = false;          // the graph is gone: segments return as they empty
  void* return_stream = nullptr;  // ... to the general cache, for use on this stream
};

struct CachingAllocator::State {
  std::unique_ptr<DeviceMemory> memory;
  mutable std::mutex mutex;
  Pool small_pool;
  Pool large_pool;
  std::unordered_map<void*, Block*> live;         // handed-out blocks by address
  std::vector<std::pair<void*, Block*>> pending;  // (event, block) awaiting completion
  std::unordered_map<uint64_t, PrivatePool> private_pools;
  std::unordered_map<void*, uint64_t> capturing;  // stream -> the private pool it allocates from
  cuda::MemoryStats stats;

  Pool& pool_of(const Block* block) {
    if (block->pool != 0) {
      PrivatePool& p = private_pools.at(block->pool);
      return block->small ? p.small : p.large;
    }
    return block->small ? small_pool : large_pool;
  }

  // A whole free segment of a released private pool goes to the general cache.
  void return_if_released(Block* block) {
    if (block->pool == 0 || block->prev != nullptr || block->next != nullptr) return;
    auto it = private_pools.find(block->pool);
    if (!it->second.released) return;
    pool_of(block).erase(block);
    block->pool = 0;
    block->stream = it->second.return_stream;
    pool_of(block).insert(block);
    if (--it->second.segments == 0) private_pools.erase(it);
  }

  void update_peaks() {
    stats.peak_allocated_bytes = std::max(stats.peak_allocated_bytes, stats.allocated_bytes);
    stats.peak_reserved_bytes = std::max(stats.peak_reserved_bytes, stats.reserved_bytes);
  }

  // Returns a block to its pool, merging it with free neighbours of its segment.
  void release_block(Block* block) {
    block->in_use = false;
    Pool& pool = pool_of(block);
    if (Block* prev = block->prev; prev != nullptr && !prev->in_use) {
      pool.erase(prev);
      block->ptr = prev->ptr;
      block->size += prev->size;
      block->prev = prev->prev;
      if (block->prev != nullptr) block->prev->next = block;
      delete prev;
    }
    if (Block* next = block->next; next != nullptr && !next->in_use) {
      pool.erase(next);
      block->size += next->size;
      block->next = next->next;
      if (block->next != nullptr) block->next->prev = block;
      delete next;
    }
    pool.insert(block);
    return_if_released(block);
  }

  // Blocks whose last other-stream use has completed go back to their pools.
  void process_events() {
    std::erase_if(pending, [&](const std::pair<void*, Block*>& entry) {
      if (!memory->event_done(entry.first)) return false;
      memory->destroy_event(entry.first);
      if (--entry.second->pending_events == 0) release_block(entry.second);
      return true;
    });
  }

  // Gives every segment that holds no live block back to the device.
  void release_cached_segments() {
    for (Pool* pool : {&small_pool, &large_pool}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* block = *it;
        if (block->prev != nullptr || block->next != nullptr) {
          ++it;
          continue;
        }
        it = pool->erase(it);
        memory->raw_free(block->ptr);
        stats.reserved_bytes -= block->size;
        ++stats.num_device_frees;
        delete block;
      }
    }
  }

  Block* take_cached(Pool& pool, void* stream, size_t size) {
    Block key;
    key.stream = stream;
    key.size = size;
    auto it = pool.lower_bound(&key);
    if (it == pool.end() || (*it)->stream != stream) return nullptr;
    Block* block = *it;
    pool.erase(it);
    return block;
  }

  // NOTE: a capture takes whole free segments of the general cache before asking the device,
  // so a capture after warm-up steps needs no raw allocation. Their earlier work must have
  // finished: CUDAGraph synchronises the device before it begins a capture.
  Block* adopt_segment(size_t size, bool small, void* stream, uint64_t pool_id) {
    Pool& general = small ? small_pool : large_pool;
    Block* best = nullptr;
    for (Block* block : general) {
      if (block->prev != nullptr || block->next != nullptr || block->size < size) continue;
      if (best == nullptr || block->size < best->size) best = block;
    }
    if (best == nullptr) return nullptr;
    general.erase(best);
    best->stream = stream;
    best->pool = pool_id;
    ++private_pools.at(pool_id).segments;
    return best;
  }

  Block* new_segment(size_t size, size_t request, void* stream, bool small) {
    const size_t nbytes = segment_size(size);
    void* ptr = memory->raw_alloc(nbytes);
    // The device is full: give back what the cache holds and try once more (not during a
    // capture, when freeing device memory is not allowed).
    if (ptr == nullptr && capturing.empty()) {
      release_cached_segments();
      ptr = memory->raw_alloc(nbytes);
    }
    if (ptr == nullptr) {
      throw Error("CUDA out of memory: tried to allocate " + mib(request) + " MiB (allocated " +
                  mib(stats.allocated_bytes) + " MiB, reserved " + mib(stats.reserved_bytes) +
                  " MiB)");
    }
    ++stats.num_device_allocs;
    stats.reserved_bytes += nbytes;
    auto* block = new Block;
    block->stream = stream;
    block->size = nbytes;
    block->ptr = static_cast<char*>(ptr);
    block->small = small;
    return block;
  }

  // Cuts `size` bytes off the front of `block` when the rest is worth keeping in the pool.
  void maybe_split(Block* block, size_t size) {
    const size_t remaining = block->size - size;
    const bool worth_it = block->small ? remaining >= kMinBlockSize : remaining > kSmallSize;
    if (!worth_it) return;
    auto* rest = new Block;
    rest->stream = block->stream;
    rest->size = remaining;
    rest->ptr = block->ptr + size;
    rest->small = block->small;
    rest->pool = block->pool;
    rest->in_use = false;
    rest->prev = block;
    rest->next = block->next;
    if (rest->next != nullptr) rest->next->prev = rest;
    block->next = rest;
    block->size = size;
    pool_of(rest).insert(rest);
  }
};

CachingAllocator::CachingAllocator(std::unique_ptr<DeviceMemory> memory)
    : state_(std::make_unique<State>()) {
  EMBER_ASSERT(memory != nullptr, "CachingAllocator needs a DeviceMemory");
  state_->memory = std::move(memory);
}

// Cached segments go back to the device. Blocks still handed out are left to the driver:
// their owners may outlive the allocator only at process exit.
CachingAllocator::~CachingAllocator() {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  for (auto& [event, block] : s.pending) {
    s.memory->destroy_event(event);
    if (--block->pending_events == 0) s.release_block(block);
  }
  s.pending.clear();
  for (auto& [id, pool] : s.private_pools) {  // graphs outliving the allocator: process exit
    pool.released = true;
    for (Pool* p : {&pool.small, &pool.large}) {
      for (Block* block : *p) {
        if (block->prev == nullptr && block->next == nullptr) {
          s.memory->raw_free(block->ptr);
        }
        delete block;
      }
    }
  }
  s.release_cached_segments();
  for (Pool* pool : {&s.small_pool, &s.large_pool}) {
    for (Block* block : *pool) delete block;
  }
  for (auto& [ptr, block] : s.live) delete block;
}

void* CachingAllocator::allocate(size_t nbytes, void* stream) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  s.process_events();
  const size_t size = round_size(nbytes);
  const bool small = size <= kSmallSize;
  const auto capture = s.capturing.find(stream);
  const uint64_t pool_id = capture == s.capturing.end() ? 0 : capture->second;
  Block* block = nullptr;
  if (pool_id == 0) {
    block = s.take_cached(small ? s.small_pool : s.large_pool, stream, size);
  } else {
    PrivatePool& pool = s.private_pools.at(pool_id);
    block = s.take_cached(small ? pool.small : pool.large, stream, size);
    if (block == nullptr) block = s.adopt_segment(size, small, stream, pool_id);
  }
  if (block == nullptr) {
    block = s.new_segment(size, nbytes, stream, small);
    block->pool = pool_id;
    if (pool_id != 0) ++s.private_pools.at(pool_id).segments;
  }
  block->in_use = true;
  s.maybe_split(block, size);
  s.live.emplace(block->ptr, block);
  s.stats.allocated_bytes += block->size;
  s.update_peaks();
  return block->ptr;
}

void CachingAllocator::free(void* ptr) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  auto it = s.live.find(ptr);
  EMBER_ASSERT(it != s.live.end(), "CachingAllocator::free: ", ptr, " is not a live block");
  Block* block = it->second;
  s.live.erase(it);
  s.stats.allocated_bytes -= block->size;
  if (block->stream_uses.empty()) {
    s.release_block(block);
    return;
  }
  // NOTE: the block may still be read or written by work queued on the streams that used
  // it; it returns to the pool only when an event recorded on each of them has completed.
  for (void* use : block->stream_uses) {
    s.pending.emplace_back(s.memory->record_event(use), block);
    ++block->pending_events;
  }
  block->stream_uses.clear();
}

bool CachingAllocator::record_stream(void* ptr, void* stream) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  auto it = s.live.find(ptr);
  if (it == s.live.end()) return false;
  if (stream != it->second->stream) it->second->stream_uses.insert(stream);
  return true;
}

void CachingAllocator::begin_pool(uint64_t pool, void* stream) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  EMBER_ASSERT(pool != 0, "CachingAllocator::begin_pool: pool 0 is the general cache");
  EMBER_ASSERT(!s.capturing.contains(stream), "CachingAllocator::begin_pool: stream ", stream,
               " already allocates from pool ", s.capturing.at(stream));
  const auto it = s.private_pools.try_emplace(pool).first;
  EMBER_ASSERT(!it->second.released, "CachingAllocator::begin_pool: pool ", pool, " was released");
  s.capturing.emplace(stream, pool);
}

void CachingAllocator::end_pool(void* stream) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  s.capturing.erase(stream);
}

void CachingAllocator::release_pool(uint64_t pool, void* stream) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  auto it = s.private_pools.find(pool);
  if (it == s.private_pools.end()) return;
  std::erase_if(s.capturing, [&](const auto& entry) { return entry.second == pool; });
  if (it->second.segments == 0) {
    s.private_pools.erase(it);
    return;
  }
  it->second.released = true;
  it->second.return_stream = stream;
  std::vector<Block*> whole;
  for (Pool* p : {&it->second.small, &it->second.large}) {
    for (Block* block : *p) {
      if (block->prev == nullptr && block->next == nullptr) whole.push_back(block);
    }
  }
  for (Block* block : whole) s.return_if_released(block);  // may erase the pool
}

void CachingAllocator::empty_cache() {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  s.process_events();
  s.release_cached_segments();
}

cuda::MemoryStats CachingAllocator::stats() const {
  std::lock_guard lock(state_->mutex);
  return state_->stats;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard lock(state_->mutex);
  state_->stats.peak_allocated_bytes = state_->stats.allocated_bytes;
  state_->stats.peak_reserved_bytes = state_->stats.reserved_bytes;
}

}  // namespace ember::detail
