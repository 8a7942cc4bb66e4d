// SPDX-License-Identifier: Apache-2.0
// Where an array's memory lives.
//
// Only CPU memory is supported today, but no API assumes it: every array
// carries its Device, and code that needs host memory checks `is_cpu()` and
// reports what is not supported yet.
#pragma once

#include <string>

namespace pushpull {

enum class DeviceKind : uint8_t { kCPU = 0, kCUDA = 1 };

struct Device {
  DeviceKind kind = DeviceKind::kCPU;
  int id = 0;

  static constexpr Device cpu(int id = 0) { return Device{DeviceKind::kCPU, id}; }
  static constexpr Device cuda(int id = 0) { return Device{DeviceKind::kCUDA, id}; }
  constexpr bool is_cpu() const { return kind == DeviceKind::kCPU; }
  friend constexpr bool operator==(const Device&, const Device&) = default;
  // "cpu(0)", "cuda(1)".
  std::string to_string() const {
    return std::string(kind == DeviceKind::kCPU ? "cpu(" : "cuda(") + std::to_string(id) + ")";
  }
};

}  // namespace pushpull
