// The emulated CUDA launch (emulate.h): blocks one after another, a block's threads as fibers
// switching at barriers and warp collectives, shared memory poisoned per block.
#include "emulate.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace ember::cuda_emu {
namespace {

constexpr size_t kStackBytes = 512 * 1024;
constexpr unsigned kMaxBlockThreads = 1024;
constexpr size_t kMaxDynamicShared = 227 * 1024;  // sm_90's opt-in limit
constexpr unsigned char kPoison = 0xff;

enum class State { kRunnable, kBarrier, kWarp, kDone };

struct Copy {
  void* dst;
  const void* src;
  size_t bytes;
  bool valid;
};

struct Planted {
  bool active = false;
  Bug bug = Bug::kMissingBarrier;
  int which = 0;
  int64_t hits = 0;
};
Planted g_planted;

struct Fiber {
  ucontext_t context;
  int barriers = 0;  // __syncthreads calls so far
  State state = State::kRunnable;
  uint3 index;
  int linear = 0;
  // The warp collective it waits in.
  const char* what = nullptr;
  unsigned mask = 0;
  void* io = nullptr;
  Resolve resolve = nullptr;
  // cp.async: the open group, then the committed ones, oldest first.
  std::vector<Copy> open;
  std::deque<std::vector<Copy>> groups;
  std::exception_ptr error;
};

// Fiber stacks, each below a guard page, kept for the next launch.
class Stacks {
 public:
  char* get(size_t i) {
    while (stacks_.size() <= i) {
      const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
      void* p = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      EMBER_CHECK(p != MAP_FAILED, "emulated CUDA launch", "cannot map a thread's stack");
      mprotect(p, page, PROT_NONE);
      stacks_.push_back(static_cast<char*>(p) + page);
    }
    return stacks_[i];
  }

 private:
  std::vector<char*> stacks_;
};

struct Launch {
  const char* kernel = nullptr;
  const std::function<void()>* thread = nullptr;
  std::vector<Fiber> fibers;
  Fiber* current = nullptr;
  ucontext_t scheduler;
  std::vector<uint64_t> dynamic;  // 16-byte aligned by allocation of pairs
  unsigned char* dynamic_bytes = nullptr;
  std::map<const void*, std::vector<uint64_t>> statics;  // EMBER_SHARED, by declaration
};

std::mutex g_mutex;  // one emulated launch at a time (the shared section is global)
Launch* g_launch = nullptr;
uint64_t g_launches = 0;
Order g_order = Order::kAlternate;
Stacks g_stacks;

Launch& active(const char* what) {
  EMBER_CHECK(g_launch != nullptr && g_launch->current != nullptr, what,
              "called outside an emulated kernel");
  return *g_launch;
}

std::string where(const Launch& l, const Fiber& f) {
  std::ostringstream s;
  s << l.kernel << " block (" << blockIdx.x << ", " << blockIdx.y << ", " << blockIdx.z
    << ") thread (" << f.index.x << ", " << f.index.y << ", " << f.index.z << ")";
  return s.str();
}

void land(std::vector<Copy>& group) {
  for (const Copy& c : group) {
    if (c.valid) {
      std::memcpy(c.dst, c.src, c.bytes);
    } else {
      std::memset(c.dst, 0, c.bytes);
    }
  }
  group.clear();
}

void land_all(Fiber& f) {
  while (!f.groups.empty()) {
    land(f.groups.front());
    f.groups.pop_front();
  }
  land(f.open);
}

// AddressSanitizer follows the switches between the scheduler's stack and the fibers'
// (without it, a switch looks like a stack overflow); nothing in other builds.
#if defined(__SANITIZE_ADDRESS__)
const void* g_scheduler_stack = nullptr;
size_t g_scheduler_stack_size = 0;
void switching_to(void** fake_stack, const void* bottom, size_t size) {
  __sanitizer_start_switch_fiber(fake_stack, bottom, size);
}
void switched(void* fake_stack, bool from_scheduler) {
  __sanitizer_finish_switch_fiber(fake_stack, from_scheduler ? &g_scheduler_stack : nullptr,
                                  from_scheduler ? &g_scheduler_stack_size : nullptr);
}
#else
void switching_to(void**, const void*, size_t) {}
void switched(void*, bool) {}
#endif

void fiber_main(int index) {
  Fiber& f = g_launch->fibers[static_cast<size_t>(index)];
  switched(nullptr, true);
  try {
    const bool last = blockIdx.x == gridDim.x - 1 && blockIdx.y == gridDim.y - 1 &&
                      blockIdx.z == gridDim.z - 1 &&
                      index + 1 == static_cast<int>(g_launch->fibers.size());
    if (g_planted.active && g_planted.bug == Bug::kLostTailThread && last) {
      ++g_planted.hits;
    } else {
      (*g_launch->thread)();
    }
    land_all(f);
  } catch (...) {
    f.error = std::current_exception();
  }
  f.state = State::kDone;
#if defined(__SANITIZE_ADDRESS__)
  switching_to(nullptr, g_scheduler_stack, g_scheduler_stack_size);  // this stack is done
#endif
}  // returns to uc_link, the scheduler

// Back to the scheduler until it resumes this fiber.
void block_on(Fiber& f, State state) {
  f.state = state;
  void* fake_stack = nullptr;
#if defined(__SANITIZE_ADDRESS__)
  switching_to(&fake_stack, g_scheduler_stack, g_scheduler_stack_size);
#endif
  swapcontext(&f.context, &g_launch->scheduler);
  switched(fake_stack, true);
}

void resume(Launch& l, Fiber& f) {
  threadIdx = f.index;
  l.current = &f;
  void* fake_stack = nullptr;
  switching_to(&fake_stack, f.context.uc_stack.ss_sp, f.context.uc_stack.ss_size);
  swapcontext(&l.scheduler, &f.context);
  switched(fake_stack, false);
  l.current = nullptr;
  if (f.error) {
    try {
      std::rethrow_exception(f.error);
    } catch (const std::exception& e) {
      throw Error(detail::str_cat(where(l, f), ": ", e.what()));
    }
  }
}

// Completes every collective of warp w whose lanes have all arrived; whether any did.
bool resolve_warp(Launch& l, int w, int threads) {
  bool progressed = false;
  {
    const int first = w * kWarpSize, lanes = std::min(kWarpSize, threads - first);
    for (int lane = 0; lane < lanes; ++lane) {
      Fiber& f = l.fibers[static_cast<size_t>(first + lane)];
      if (f.state != State::kWarp) continue;
      EMBER_CHECK((f.mask >> lane) & 1u, where(l, f), f.what, " with mask 0x", std::hex, f.mask,
                  " that leaves out its own lane ", std::dec, lane);
      void* io[kWarpSize] = {};
      bool ready = true;
      for (int m = 0; m < kWarpSize; ++m) {
        if (((f.mask >> m) & 1u) == 0) continue;
        EMBER_CHECK(m < lanes, where(l, f), f.what, " with mask 0x", std::hex, f.mask,
                    " names lane ", std::dec, m, " which the block (", threads,
                    " threads) does not have");
        const Fiber& o = l.fibers[static_cast<size_t>(first + m)];
        if (o.state != State::kWarp) {
          ready = false;
          continue;
        }
        EMBER_CHECK(o.mask == f.mask && o.resolve == f.resolve, where(l, f), f.what, " (mask 0x",
                    std::hex, f.mask, ") meets lane ", std::dec, m, " in ", o.what, " (mask 0x",
                    std::hex, o.mask, ")");
        io[m] = o.io;
      }
      if (!ready) continue;
      f.resolve(io, f.mask);
      for (int m = 0; m < kWarpSize; ++m) {
        if (io[m] != nullptr) l.fibers[static_cast<size_t>(first + m)].state = State::kRunnable;
      }
      progressed = true;
    }
  }
  return progressed;
}

// Why no thread of the block can go on.
[[noreturn]] void report_stuck(Launch& l) {
  const Fiber* barrier = nullptr;
  const Fiber* done = nullptr;
  const Fiber* warp = nullptr;
  for (const Fiber& f : l.fibers) {
    if (f.state == State::kBarrier && barrier == nullptr) barrier = &f;
    if (f.state == State::kDone && done == nullptr) done = &f;
    if (f.state == State::kWarp && warp == nullptr) warp = &f;
  }
  if (barrier != nullptr && done != nullptr) {
    throw Error(detail::str_cat(where(l, *barrier), " waits in __syncthreads, which thread (",
                                done->index.x, ", ", done->index.y, ", ", done->index.z,
                                ") never reaches: it has exited"));
  }
  if (warp != nullptr) {
    throw Error(detail::str_cat(where(l, *warp), " waits in ", warp->what, " (mask 0x",
                                detail::str_cat(std::hex, warp->mask),
                                ") for a lane that never comes (exited or in __syncthreads)"));
  }
  throw Error(detail::str_cat(l.kernel, ": emulated block cannot go on"));
}

// Thread i of the block, ready to run from the kernel's start (its own function: getcontext
// would let longjmp-style clobbering warnings reach the scheduler's loop).
__attribute__((noinline)) void start_fiber(Launch& l, int i) {
  Fiber& f = l.fibers[static_cast<size_t>(i)];
  f.state = State::kRunnable;
  f.barriers = 0;
  f.error = nullptr;
  f.open.clear();
  f.groups.clear();
  getcontext(&f.context);
  f.context.uc_stack.ss_sp = g_stacks.get(static_cast<size_t>(i));
  f.context.uc_stack.ss_size = kStackBytes;
  f.context.uc_link = &l.scheduler;
  makecontext(&f.context, reinterpret_cast<void (*)()>(fiber_main), 1, i);
}

void run_block(Launch& l, int threads, bool reverse) {
  if (!l.dynamic.empty()) std::memset(l.dynamic.data(), kPoison, l.dynamic.size() * 8);
  for (auto& [key, words] : l.statics) std::memset(words.data(), kPoison, words.size() * 8);
  for (int i = 0; i < threads; ++i) start_fiber(l, i);
  const int warps = (threads + kWarpSize - 1) / kWarpSize;
  for (;;) {
    // Each warp in turn runs as far as it can (to the block barrier, or its end) before the
    // next starts, so a warp reading what another has not written yet sees poison.
    for (int k = 0; k < warps; ++k) {
      const int w = reverse ? warps - 1 - k : k;
      const int first = w * kWarpSize, lanes = std::min(kWarpSize, threads - first);
      do {
        for (int j = 0; j < lanes; ++j) {
          Fiber& f = l.fibers[static_cast<size_t>(first + (reverse ? lanes - 1 - j : j))];
          if (f.state == State::kRunnable) resume(l, f);
        }
      } while (resolve_warp(l, w, threads));
    }
    reverse = !reverse;
    int done = 0, barrier = 0;
    for (int i = 0; i < threads; ++i) {
      const State s = l.fibers[static_cast<size_t>(i)].state;
      done += s == State::kDone;
      barrier += s == State::kBarrier;
    }
    if (done == threads) return;
    if (barrier == threads) {
      for (int i = 0; i < threads; ++i) l.fibers[static_cast<size_t>(i)].state = State::kRunnable;
      continue;
    }
    report_stuck(l);
  }
}

}  // namespace

void launch(const char* kernel, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
            const std::function<void()>& thread) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  EMBER_CHECK(g_launch == nullptr, kernel, "launched from inside an emulated kernel");
  const uint64_t threads64 = uint64_t{block.x} * block.y * block.z;
  EMBER_CHECK(threads64 > 0 && threads64 <= kMaxBlockThreads && block.z <= 64, kernel,
              "invalid block (", block.x, ", ", block.y, ", ", block.z, ")");
  EMBER_CHECK(grid.x > 0 && grid.y > 0 && grid.z > 0 && grid.x <= 0x7fffffffu && grid.y <= 65535 &&
                  grid.z <= 65535,
              kernel, "invalid grid (", grid.x, ", ", grid.y, ", ", grid.z, ")");
  EMBER_CHECK(dynamic_shared_bytes <= kMaxDynamicShared, kernel, "asks ", dynamic_shared_bytes,
              " bytes of dynamic shared memory, more than ", kMaxDynamicShared);
  const int threads = static_cast<int>(threads64);
  Launch l;
  l.kernel = kernel;
  l.thread = &thread;
  l.fibers.resize(static_cast<size_t>(threads));
  for (unsigned z = 0, i = 0; z < block.z; ++z) {
    for (unsigned y = 0; y < block.y; ++y) {
      for (unsigned x = 0; x < block.x; ++x, ++i) {
        l.fibers[i].index = {x, y, z};
        l.fibers[i].linear = static_cast<int>(i);
      }
    }
  }
  l.dynamic.resize((dynamic_shared_bytes + 15) / 16 * 2);
  l.dynamic_bytes = reinterpret_cast<unsigned char*>(l.dynamic.data());
  blockDim = block;
  gridDim = grid;
  struct Active {
    explicit Active(Launch* l) { g_launch = l; }
    ~Active() { g_launch = nullptr; }
  } active_launch(&l);
  const bool reverse =
      g_order == Order::kAlternate ? (g_launches++ % 2) == 1 : g_order == Order::kReverseFirst;
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = {x, y, z};
        run_block(l, threads, reverse);
      }
    }
  }
}

void set_order(Order order) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_order = order;
}

void* dynamic_shared() { return active("dynamic shared memory").dynamic_bytes; }

void* static_shared(const void* key, size_t bytes) {
  Launch& l = active("shared memory");
  auto [it, added] = l.statics.try_emplace(key);
  if (added) {
    it->second.assign((bytes + 15) / 16 * 2, 0);
    std::memset(it->second.data(), kPoison, it->second.size() * 8);
  }
  EMBER_ASSERT(it->second.size() * 8 >= bytes, "shared memory of ", bytes, " bytes changed size");
  return it->second.data();
}

int lane() { return active("lane").current->linear % kWarpSize; }

void syncthreads() {
  Launch& l = active("__syncthreads");
  Fiber& f = *l.current;
  if (g_planted.active && g_planted.bug == Bug::kMissingBarrier &&
      f.barriers++ == g_planted.which) {
    ++g_planted.hits;
    return;
  }
  block_on(f, State::kBarrier);
}

void warp_collective(const char* what, unsigned mask, void* io, Resolve resolve) {
  Fiber& f = *active(what).current;
  if (g_planted.active && g_planted.bug == Bug::kWrongShuffleMask && (mask >> 31) != 0u) {
    ++g_planted.hits;
    mask &= ~(1u << 31);
  }
  f.what = what;
  f.mask = mask;
  f.io = io;
  f.resolve = resolve;
  block_on(f, State::kWarp);
}

void cp_async(void* dst, const void* src, size_t bytes, bool valid) {
  Fiber& f = *active("cp.async").current;
  std::memset(dst, kPoison, bytes);  // not there until a wait lands it
  f.open.push_back({dst, src, bytes, valid});
}

void cp_async_commit() {
  Fiber& f = *active("cp.async.commit_group").current;
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}

void cp_async_wait(int pending) {
  Fiber& f = *active("cp.async.wait_group").current;
  if (g_planted.active && g_planted.bug == Bug::kMissingCpAsyncWait) {
    ++g_planted.hits;
    return;
  }
  while (static_cast<int>(f.groups.size()) > pending) {
    land(f.groups.front());
    f.groups.pop_front();
  }
}

PlantedBug::PlantedBug(Bug bug, int which) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  EMBER_CHECK(!g_planted.active, "PlantedBug", "one planted bug at a time");
  g_planted = {true, bug, which, 0};
}
PlantedBug::~PlantedBug() {
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_planted.active = false;
}
int64_t PlantedBug::hits() const { return g_planted.hits; }

void trap() { throw Error("__trap() in an emulated CUDA kernel"); }

void resolve_vote(void* const* io, unsigned mask) {
  unsigned ballot = 0;
  for (int l = 0; l < kWarpSize; ++l) {
    if (io[l] != nullptr && static_cast<VoteIo*>(io[l])->predicate) ballot |= 1u << l;
  }
  for (int l = 0; l < kWarpSize; ++l) {
    if (io[l] != nullptr) static_cast<VoteIo*>(io[l])->ballot = ballot & mask;
  }
}

unsigned vote(const char* what, unsigned mask, bool predicate) {
  VoteIo io{predicate, 0};
  warp_collective(what, mask, &io, resolve_vote);
  return io.ballot;
}

namespace {

struct LdmatrixIo {
  const uint16_t* row;
  bool transposed;
  uint32_t r[4];
};

uint32_t pack(uint16_t lo, uint16_t hi) { return uint32_t{lo} | (uint32_t{hi} << 16); }

void resolve_ldmatrix(void* const* io, unsigned mask) {
  EMBER_CHECK(mask == 0xffffffffu, "ldmatrix", "needs the full warp, got mask 0x", std::hex, mask);
  const auto at = [&](int matrix, int r, int c) {
    uint16_t value;
    std::memcpy(&value, static_cast<LdmatrixIo*>(io[8 * matrix + r])->row + c, sizeof(value));
    return value;
  };
  for (int lane = 0; lane < kWarpSize; ++lane) {
    auto* me = static_cast<LdmatrixIo*>(io[lane]);
    const int g = lane / 4, c = 2 * (lane % 4);
    for (int i = 0; i < 4; ++i) {
      me->r[i] =
          me->transposed ? pack(at(i, c, g), at(i, c + 1, g)) : pack(at(i, g, c), at(i, g, c + 1));
    }
  }
}

struct MmaIo {
  uint32_t a[4], b[2];
  bool bf16;
  float* d;
};

float element(uint32_t reg, int half, bool bf16) {
  const auto bits = static_cast<uint16_t>(reg >> (16 * half));
  return bf16 ? BFloat16::to_float(bits) : Half::to_float(bits);
}

void resolve_mma(void* const* io, unsigned mask) {
  EMBER_CHECK(mask == 0xffffffffu, "mma.sync", "needs the full warp, got mask 0x", std::hex, mask);
  float am[16][16], bm[16][8];
  for (int l = 0; l < kWarpSize; ++l) {
    const auto* in = static_cast<const MmaIo*>(io[l]);
    const int group = l >> 2, tig = l % 4;
    for (int i = 0; i < 8; ++i) {  // a0 .. a7: two per register, low half first
      const int row = (i < 2 || (i >= 4 && i < 6)) ? group : group + 8;
      const int col = tig * 2 + (i & 1) + (i >= 4 ? 8 : 0);
      am[row][col] = element(in->a[i / 2], i % 2, in->bf16);
    }
    for (int i = 0; i < 4; ++i) {  // b0 .. b3
      const int row = tig * 2 + (i & 1) + (i >= 2 ? 8 : 0);
      bm[row][group] = element(in->b[i / 2], i % 2, in->bf16);
    }
  }
  for (int l = 0; l < kWarpSize; ++l) {
    auto* me = static_cast<MmaIo*>(io[l]);
    const int group = l >> 2, tig = l % 4;
    for (int i = 0; i < 4; ++i) {  // c0 .. c3
      const int row = group + (i >= 2 ? 8 : 0), col = tig * 2 + (i & 1);
      float total = 0.0f;
      for (int kk = 0; kk < 16; ++kk) total += am[row][kk] * bm[kk][col];
      me->d[i] += total;
    }
  }
}

}  // namespace

void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* row, bool transposed) {
  LdmatrixIo io{row, transposed, {}};
  warp_collective(transposed ? "ldmatrix.trans" : "ldmatrix", 0xffffffffu, &io, resolve_ldmatrix);
  for (int i = 0; i < 4; ++i) r[i] = io.r[i];
}

void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bool bf16) {
  MmaIo io{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}, bf16, d};
  warp_collective("mma.sync", 0xffffffffu, &io, resolve_mma);
}

}  // namespace ember::cuda_emu
