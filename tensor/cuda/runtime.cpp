// Devices, streams and events: the implementation of ember/tensor/cuda.h.
#include <array>
#include <memory>
#include <mutex>
#include <vector>

#include "../cuda.h"
#include "cuda_check.h"
#include "cuda_context.h"

namespace ember::detail {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  cudaGetLastError();  // clear a non-sticky error so the next check reports its own
  throw Error(str_cat("CUDA error: ", call, " failed: ", cudaGetErrorString(status), " (",
                      cudaGetErrorName(status), ") at ", file, ":", line));
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  throw Error(str_cat("cuBLAS error: ", call, " failed: ", cublasGetStatusString(status), " (",
                      cublasGetStatusName(status), ") at ", file, ":", line));
}

void check_cuda_device(int device, const char* op) {
  const int count = cuda::device_count();
  EMBER_CHECK(count > 0, op, "no CUDA device is visible");
  EMBER_CHECK(device >= 0 && device < count, op, "CUDA device ", device, " is out of range (",
              count, " device", count == 1 ? "" : "s", " visible)");
}

namespace {

// The calling thread's current stream per device; missing entries mean the default stream.
std::vector<cudaStream_t>& thread_streams() {
  thread_local std::vector<cudaStream_t> streams;
  return streams;
}

constexpr int kStreamsPerPool = 32;

// Streams handed out by Stream::create, created on first use and kept for the process.
struct StreamPool {
  std::mutex mutex;
  std::array<cudaStream_t, kStreamsPerPool> streams[2] = {};  // [low, high priority]
  unsigned next[2] = {0, 0};
};

StreamPool& stream_pool(int device) {
  static std::vector<std::unique_ptr<StreamPool>>* pools = [] {
    auto* result = new std::vector<std::unique_ptr<StreamPool>>();
    for (int d = 0; d < cuda::device_count(); ++d)
      result->push_back(std::make_unique<StreamPool>());
    return result;
  }();
  return *(*pools)[device];
}

}  // namespace

int resolve_cuda_device(int device, const char* op) {
  EMBER_CHECK(cuda::device_count() > 0, op, "no CUDA device is visible");
  if (device < 0) device = cuda::current_device();
  check_cuda_device(device, op);
  return device;
}

cudaStream_t current_cuda_stream(int device) {
  const auto& streams = thread_streams();
  return device < static_cast<int>(streams.size()) ? streams[device] : nullptr;
}

}  // namespace ember::detail

namespace ember::cuda {

DeviceGuard::DeviceGuard(int device) {
  int current = 0;
  EMBER_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) {
    EMBER_CUDA_CHECK(cudaSetDevice(device));
    previous_ = current;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);  // a destructor cannot report a failure
}

bool is_available() { return device_count() > 0; }

int device_count() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // no driver or no device: not an error, just no CUDA
      return 0;
    }
    return n;
  }();
  return count;
}

int current_device() {
  EMBER_CHECK(device_count() > 0, "current_device", "no CUDA device is visible");
  int device = 0;
  EMBER_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

void set_device(int device) {
  detail::check_cuda_device(device, "set_device");
  EMBER_CUDA_CHECK(cudaSetDevice(device));
}

std::pair<int, int> device_capability(int device) {
  device = detail::resolve_cuda_device(device, "device_capability");
  int major = 0, minor = 0;
  EMBER_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  EMBER_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return {major, minor};
}

void synchronize(int device) {
  device = detail::resolve_cuda_device(device, "synchronize");
  cuda::DeviceGuard guard(device);
  EMBER_CUDA_CHECK(cudaDeviceSynchronize());
}

Stream Stream::create(int device, bool high_priority) {
  device = detail::resolve_cuda_device(device, "Stream::create");
  auto& pool = detail::stream_pool(device);
  std::lock_guard<std::mutex> lock(pool.mutex);
  const int priority_class = high_priority ? 1 : 0;
  cudaStream_t& stream =
      pool.streams[priority_class][pool.next[priority_class]++ % detail::kStreamsPerPool];
  if (stream == nullptr) {
    cuda::DeviceGuard guard(device);
    int least = 0, greatest = 0;
    EMBER_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    EMBER_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking,
                                                  high_priority ? greatest : least));
  }
  return Stream(stream, device);
}

void Stream::synchronize() const {
  cuda::DeviceGuard guard(device_);
  EMBER_CUDA_CHECK(cudaStreamSynchronize(handle_));
}

bool Stream::query() const {
  cuda::DeviceGuard guard(device_);
  const cudaError_t status = cudaStreamQuery(handle_);
  if (status == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  EMBER_CUDA_CHECK(status);
  return true;
}

Stream current_stream(int device) {
  device = detail::resolve_cuda_device(device, "current_stream");
  return Stream(detail::current_cuda_stream(device), device);
}

void set_current_stream(Stream stream) {
  detail::check_cuda_device(stream.device(), "set_current_stream");
  auto& streams = detail::thread_streams();
  if (static_cast<int>(streams.size()) <= stream.device()) {
    streams.resize(static_cast<size_t>(device_count()), nullptr);
  }
  streams[static_cast<size_t>(stream.device())] = stream.handle();
}

StreamGuard::StreamGuard(Stream stream)
    : previous_(current_stream(stream.device())), previous_device_(current_device()) {
  set_device(stream.device());
  set_current_stream(stream);
}

StreamGuard::~StreamGuard() {
  // Both were valid when the guard was built, so restoring them cannot fail on our side.
  detail::thread_streams()[static_cast<size_t>(previous_.device())] = previous_.handle();
  cudaSetDevice(previous_device_);
}

Event::Event(bool enable_timing) : enable_timing_(enable_timing) {}

Event::~Event() {
  if (handle_ != nullptr) cudaEventDestroy(handle_);
}

Event::Event(Event&& other) noexcept
    : handle_(other.handle_), enable_timing_(other.enable_timing_) {
  other.handle_ = nullptr;
}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) cudaEventDestroy(handle_);
    handle_ = other.handle_;
    enable_timing_ = other.enable_timing_;
    other.handle_ = nullptr;
  }
  return *this;
}

void Event::record(Stream stream) {
  cuda::DeviceGuard guard(stream.device());
  if (handle_ == nullptr) {  // created on first record, on the stream's device
    EMBER_CUDA_CHECK(cudaEventCreateWithFlags(
        &handle_, enable_timing_ ? cudaEventDefault : cudaEventDisableTiming));
  }
  EMBER_CUDA_CHECK(cudaEventRecord(handle_, stream.handle()));
}

void Event::wait(Stream stream) const {
  if (handle_ == nullptr) return;  // never recorded: nothing to wait for
  cuda::DeviceGuard guard(stream.device());
  EMBER_CUDA_CHECK(cudaStreamWaitEvent(stream.handle(), handle_, 0));
}

void Event::synchronize() const {
  if (handle_ != nullptr) EMBER_CUDA_CHECK(cudaEventSynchronize(handle_));
}

bool Event::query() const {
  if (handle_ == nullptr) return true;
  const cudaError_t status = cudaEventQuery(handle_);
  if (status == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  EMBER_CUDA_CHECK(status);
  return true;
}

float Event::elapsed_ms(const Event& end) const {
  EMBER_CHECK(enable_timing_ && end.enable_timing_, "Event::elapsed_ms",
              "both events need enable_timing = true");
  EMBER_CHECK(handle_ != nullptr && end.handle_ != nullptr, "Event::elapsed_ms",
              "both events must be recorded first");
  float ms = 0.0f;
  EMBER_CUDA_CHECK(cudaEventElapsedTime(&ms, handle_, end.handle_));
  return ms;
}

}  // namespace ember::cuda
