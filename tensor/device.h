// Where a tensor's memory lives: the host, or one CUDA device.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace ember {

enum class DeviceType : uint8_t { kCPU = 0, kCUDA = 1 };
inline constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;  // CUDA ordinal; always 0 for the CPU

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0)
      : type(t), index(t == DeviceType::kCPU ? 0 : i) {}  // NOLINT
  // Parses "cpu", "cuda" and "cuda:N"; throws ember::Error on anything else.
  explicit Device(std::string_view spec);

  constexpr bool is_cpu() const { return type == DeviceType::kCPU; }
  constexpr bool is_cuda() const { return type == DeviceType::kCUDA; }
  friend constexpr bool operator==(Device a, Device b) = default;
  std::string str() const;  // "cpu" or "cuda:N"
};

inline constexpr Device kCPU{DeviceType::kCPU, 0};
inline Device cuda_device(int index = 0) { return Device(DeviceType::kCUDA, index); }

std::ostream& operator<<(std::ostream& out, Device d);

}  // namespace ember
