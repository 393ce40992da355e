// Storage: a ref-counted byte buffer on one device, shared by a tensor and all its views.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "allocator.h"
#include "device.h"

namespace ember {

class Storage {
 public:
  Storage() = default;
  // Allocates `nbytes` on `device` with `allocator` (allocator_for(device) when null).
  Storage(size_t nbytes, Device device, Allocator* allocator = nullptr);
  // Wraps memory the caller owns; `owner` keeps it alive (a no-op deleter borrows it).
  Storage(DataPtr owner, size_t nbytes, Device device);

  void* data() const { return impl_ ? impl_->data.get() : nullptr; }
  size_t nbytes() const { return impl_ ? impl_->nbytes : 0; }
  Device device() const { return impl_ ? impl_->device : Device(); }
  bool defined() const { return impl_ != nullptr; }
  bool is_pinned() const { return impl_ && impl_->pinned; }
  long use_count() const { return impl_.use_count(); }
  bool is_same(const Storage& other) const { return impl_ == other.impl_; }

  // Bumped by every in-place write through any view; autograd uses it to detect tensors
  // modified after they were saved for backward.
  uint64_t version() const { return impl_ ? impl_->version : 0; }
  void bump_version() const {
    if (impl_) ++impl_->version;
  }

 private:
  struct Impl {
    DataPtr data;
    size_t nbytes = 0;
    Device device;
    bool pinned = false;
    uint64_t version = 0;
  };
  std::shared_ptr<Impl> impl_;
};

}  // namespace ember
