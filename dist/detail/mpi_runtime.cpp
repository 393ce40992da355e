#include "mpi_runtime.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

namespace ember::dist::detail {

namespace {

std::atomic<int> g_thread_level{-1};
std::atomic<bool> g_job_broken{false};
std::mutex g_serialized_mutex;

// The goodbyes still in flight (post_goodbye), with the buffers MPI writes to.
struct Goodbye {
  std::vector<char> mine, all;
  MPI_Request request = MPI_REQUEST_NULL;
  std::chrono::steady_clock::time_point until;  // given up at exit after this
};
std::mutex g_goodbye_mutex;
std::vector<std::unique_ptr<Goodbye>>& goodbyes() {
  static auto* pending = new std::vector<std::unique_ptr<Goodbye>>;
  return *pending;
}

// Drops the goodbyes that finished; with `at_exit`, first waits for the others until their
// time is up (a rank that never leaves or collects again). Under MpiLock.
void settle_goodbyes(bool at_exit) {
  std::lock_guard<std::mutex> lock(g_goodbye_mutex);
  auto& pending = goodbyes();
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    std::erase_if(pending, [&](const std::unique_ptr<Goodbye>& g) {
      int done = 0;
      if (MPI_Test(&g->request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return true;
      return done != 0 || (at_exit && now >= g->until);
    });
    if (!at_exit || pending.empty()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Finalises MPI at exit when ember initialised it (or aborts the job when a group broke).
struct MpiFinalizer {
  bool owned = false;
  ~MpiFinalizer() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!owned || finalized) return;
    if (g_job_broken.load()) {
      abort_mpi_job();
    } else {
      settle_goodbyes(/*at_exit=*/true);
      MPI_Finalize();
    }
  }
};

template <typename T, typename F>
void reduce_16bit(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(inout);
  const F combine;
  for (int i = 0; i < *len; ++i) {
    b[i] = T(combine(static_cast<float>(a[i]), static_cast<float>(b[i])));
  }
}
struct Add {
  float operator()(float a, float b) const { return a + b; }
};
struct Max {
  float operator()(float a, float b) const { return (a > b || a != a) ? a : b; }
};
struct Min {
  float operator()(float a, float b) const { return (a < b || a != a) ? a : b; }
};

struct HalfOps {
  MPI_Op half[3];  // sum, max, min
  MPI_Op bf16[3];
};

const HalfOps& half_ops() {
  static const HalfOps ops = [] {
    HalfOps o{};
    check_mpi(MPI_Op_create(&reduce_16bit<Half, Add>, 1, &o.half[0]), "MPI_Op_create");
    check_mpi(MPI_Op_create(&reduce_16bit<Half, Max>, 1, &o.half[1]), "MPI_Op_create");
    check_mpi(MPI_Op_create(&reduce_16bit<Half, Min>, 1, &o.half[2]), "MPI_Op_create");
    check_mpi(MPI_Op_create(&reduce_16bit<BFloat16, Add>, 1, &o.bf16[0]), "MPI_Op_create");
    check_mpi(MPI_Op_create(&reduce_16bit<BFloat16, Max>, 1, &o.bf16[1]), "MPI_Op_create");
    check_mpi(MPI_Op_create(&reduce_16bit<BFloat16, Min>, 1, &o.bf16[2]), "MPI_Op_create");
    return o;
  }();
  return ops;
}

const char* level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    default:
      return "MPI_THREAD_MULTIPLE";
  }
}

}  // namespace

// Serialised until MPI is known to allow MPI_THREAD_MULTIPLE.
std::atomic<std::mutex*> g_mpi_call_mutex{&g_serialized_mutex};

void check_mpi(int code, const std::string& what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  throw Error(what + ": " + std::string(text, static_cast<size_t>(length)) + " (MPI code " +
              std::to_string(code) + ")");
}

void ensure_mpi_initialized() {
  static std::mutex init_mutex;
  static MpiFinalizer finalizer;
  std::lock_guard<std::mutex> lock(init_mutex);
  if (g_thread_level.load() >= 0) return;
  int initialized = 0, finalized = 0;
  check_mpi(MPI_Initialized(&initialized), "MPI_Initialized");
  check_mpi(MPI_Finalized(&finalized), "MPI_Finalized");
  EMBER_CHECK(!finalized, "init_process_group", "MPI was already finalised");
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    check_mpi(MPI_Query_thread(&provided), "MPI_Query_thread");
  } else {
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    finalizer.owned = true;
  }
  EMBER_CHECK(provided >= MPI_THREAD_SERIALIZED, "init_process_group", "MPI provides only ",
              level_name(provided),
              "; ember's communication thread needs MPI_THREAD_SERIALIZED or better (initialise "
              "MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or let ember do it)");
  g_mpi_call_mutex.store(provided >= MPI_THREAD_MULTIPLE ? nullptr : &g_serialized_mutex);
  g_thread_level.store(provided);
}

void post_goodbye(MPI_Comm comm, const void* bytes, int count, int size,
                  std::chrono::milliseconds linger) {
  settle_goodbyes(/*at_exit=*/false);
  auto g = std::make_unique<Goodbye>();
  g->mine.assign(static_cast<const char*>(bytes), static_cast<const char*>(bytes) + count);
  g->all.resize(static_cast<size_t>(count) * static_cast<size_t>(size));
  g->until = std::chrono::steady_clock::now() + linger;
  if (MPI_Iallgather(g->mine.data(), count, MPI_BYTE, g->all.data(), count, MPI_BYTE, comm,
                     &g->request) != MPI_SUCCESS) {
    return;  // nobody to tell: the peers' own waits time out as before
  }
  std::lock_guard<std::mutex> lock(g_goodbye_mutex);
  goodbyes().push_back(std::move(g));
}

void mark_mpi_job_broken() { g_job_broken.store(true); }

void abort_mpi_job() {
  std::fflush(stdout);
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return; should it, the process still ends
}

namespace {

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case kF32:
      return MPI_FLOAT;
    case kF64:
      return MPI_DOUBLE;
    case kF16:
    case kBF16:
      return MPI_UINT16_T;
    case kI64:
      return MPI_INT64_T;
    case kI32:
      return MPI_INT32_T;
    case kU8:
    case kBool:
      return MPI_UINT8_T;
  }
  EMBER_ASSERT(false, "mpi_type: unknown dtype");
  return MPI_DATATYPE_NULL;
}

MpiTypeOp mpi_type_op(DType dtype, ReduceOp op) {
  const int index = op == ReduceOp::kMax ? 1 : op == ReduceOp::kMin ? 2 : 0;
  if (dtype == kF16) return {MPI_UINT16_T, half_ops().half[index]};
  if (dtype == kBF16) return {MPI_UINT16_T, half_ops().bf16[index]};
  if (dtype == kBool) return {MPI_UINT8_T, index == 2 ? MPI_MIN : MPI_MAX};
  return {mpi_type(dtype), index == 0 ? MPI_SUM : index == 1 ? MPI_MAX : MPI_MIN};
}

}  // namespace

MpiTypeTable::MpiTypeTable() {
  for (int d = 0; d < kNumDTypes; ++d) {
    for (int r = 0; r < kNumReduceOps; ++r) {
      table_[d][r] = mpi_type_op(static_cast<DType>(d), static_cast<ReduceOp>(r));
    }
  }
}

}  // namespace ember::dist::detail
