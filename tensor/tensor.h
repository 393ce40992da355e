// Tensor: a cheap, shared handle to an n-dimensional view of a Storage.
//
// Copying a Tensor copies the handle, not the data (as in PyTorch). Views (view, reshape,
// transpose, permute, narrow, slice, select, expand, squeeze, unsqueeze, flatten) share
// storage with their base; contiguous() copies only when the layout needs it.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "device.h"
#include "dtype.h"
#include "error.h"
#include "scalar.h"
#include "storage.h"

namespace ember {

using Shape = std::vector<int64_t>;

// "[2, 3]": how shapes appear in every error message.
std::string shape_str(const Shape& shape);

// How a 4-d image tensor [N, C, H, W] lays out its elements (torch.memory_format):
// Contiguous is row-major NCHW; ChannelsLast stores each pixel's channels together (NHWC),
// strides {H*W*C, 1, W*C, C}, while sizes and indexing stay NCHW. Preserve (for *_like
// factories and to()) keeps the source's format as suggest_memory_format() reports it.
// ChannelsLast applies to 4-d tensors only; asking for it elsewhere is an ember::Error.
enum class MemoryFormat { Contiguous, ChannelsLast, Preserve };

// "contiguous_format", "channels_last", "preserve_format": as torch prints them.
const char* memory_format_name(MemoryFormat format);
std::ostream& operator<<(std::ostream& out, MemoryFormat format);

// The options a factory takes: dtype, device, pinned host memory.
struct TensorOptions {
  DType dtype = kF32;
  Device device = kCPU;
  bool pinned_memory = false;

  TensorOptions() = default;
  TensorOptions(DType t) : dtype(t) {}    // NOLINT: zeros({2}, kF64)
  TensorOptions(Device d) : device(d) {}  // NOLINT: zeros({2}, cuda_device())
  TensorOptions(DType t, Device d) : dtype(t), device(d) {}
  TensorOptions with_dtype(DType t) const {
    auto o = *this;
    o.dtype = t;
    return o;
  }
  TensorOptions with_device(Device d) const {
    auto o = *this;
    o.device = d;
    return o;
  }
  TensorOptions with_pinned_memory(bool pinned = true) const {
    auto o = *this;
    o.pinned_memory = pinned;
    return o;
  }
};

namespace autograd {
class Node;
}
struct AutogradMeta;

class Tensor {
 public:
  Tensor() = default;  // undefined: holds nothing
  // A tensor viewing `storage` with the given geometry (strides in elements).
  Tensor(Storage storage, DType dtype, Shape sizes, Shape strides, int64_t storage_offset = 0);

  bool defined() const { return impl_ != nullptr; }
  // --- geometry -----------------------------------------------------------------------
  const Shape& sizes() const { return impl().sizes; }
  const Shape& strides() const { return impl().strides; }
  int64_t size(int64_t dim) const;  // negative dims count from the end
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(impl().sizes.size()); }
  int64_t numel() const { return impl().numel; }
  int64_t storage_offset() const { return impl().offset; }
  size_t element_size() const { return ember::element_size(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage.device(); }
  bool is_cuda() const { return device().is_cuda(); }
  bool is_cpu() const { return device().is_cpu(); }
  bool is_floating_point() const { return is_floating(dtype()); }
  bool is_contiguous() const;
  // True when the layout is dense in `format` (size-1 dims may have any stride, as in
  // PyTorch); ChannelsLast is false for tensors that are not 4-d.
  bool is_contiguous(MemoryFormat format) const;
  // ChannelsLast when a 4-d tensor's strides order its dims as NHWC (PyTorch's rule, so an
  // [N, 1, H, W] tensor converted to channels_last still reports it), else Contiguous.
  MemoryFormat suggest_memory_format() const;
  bool is_pinned() const { return impl().storage.is_pinned(); }
  const Storage& storage() const { return impl().storage; }
  TensorOptions options() const { return TensorOptions(dtype(), device()); }
  // True when both handles refer to the same tensor (not merely equal values).
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  // A Python-number operand wrapped as a 0-d tensor: it takes part in type promotion only
  // by category, as in PyTorch (int_tensor + 2.5 is f32, f16_tensor * 2.0 stays f16).
  bool is_wrapped_number() const { return impl().wrapped_number; }
  void set_wrapped_number(bool wrapped) { impl().wrapped_number = wrapped; }

  // --- raw access ---------------------------------------------------------------------
  void* data_ptr() const {  // first element of this view
    const Impl& i = impl();
    auto* base = static_cast<char*>(i.storage.data());
    return base == nullptr ? nullptr
                           : base + i.offset * static_cast<int64_t>(ember::element_size(i.dtype));
  }
  template <typename T>
  T* data_ptr() const {
    EMBER_CHECK(dtype() == dtype_of<T>, "data_ptr", "tensor has dtype ", dtype(), " but ",
                ember::dtype_of<T>, " was asked for");
    return static_cast<T*>(data_ptr());
  }
  // The value of a one-element tensor, converted to T (copies from the GPU if needed).
  template <typename T>
  T item() const {
    return item().to<T>();
  }
  Scalar item() const;
  // Copies all elements to a host vector of T (converting the dtype), in row-major order.
  template <typename T>
  std::vector<T> to_vector() const;

  // --- views (share storage) ----------------------------------------------------------
  Tensor view(const Shape& shape) const;     // one dim may be -1; needs compatible strides
  Tensor reshape(const Shape& shape) const;  // a view when possible, else a copy
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;  // transpose of a 2-d tensor
  Tensor permute(const Shape& dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end,
               int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& shape) const;  // -1 keeps a size; size-1 dims broadcast
  Tensor expand_as(const Tensor& other) const { return expand(other.sizes()); }
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor as_strided(const Shape& sizes, const Shape& strides,
                    std::optional<int64_t> storage_offset = {}) const;
  // A new handle on the same data with no autograd history.
  Tensor detach() const;
  // Points this tensor (and every handle sharing it) at `other`'s data, keeping its autograd
  // identity; its gradient follows to the new device and dtype. Module::to() moves
  // parameters this way, so references held by optimizers stay valid.
  void set_data(const Tensor& other) const;

  // --- copies -------------------------------------------------------------------------
  Tensor contiguous() const;  // *this when already contiguous
  // *this when already dense in `format`, else a copy in it (differentiable).
  Tensor contiguous(MemoryFormat format) const;
  Tensor clone() const;  // always a fresh contiguous copy
  // A fresh copy laid out in `format`; Preserve takes suggest_memory_format().
  Tensor clone(MemoryFormat format) const;
  // Copies `src` (broadcast to this shape, any dtype or device) into this tensor.
  Tensor& copy_(const Tensor& src, bool non_blocking = false);
  Tensor to(Device device, bool non_blocking = false) const;
  Tensor to(DType dtype) const;
  Tensor to(Device device, DType dtype, bool non_blocking = false) const;
  // tensor.to(memory_format=...): *this when suggest_memory_format() is already `format`
  // (or it is Preserve), else a copy laid out in it (differentiable).
  Tensor to(MemoryFormat format) const;
  Tensor cpu() const { return to(kCPU); }
  Tensor cuda(int index = 0) const { return to(cuda_device(index)); }
  Tensor pin_memory() const;  // a copy in pinned host memory (CPU tensors only)

  // --- in place -----------------------------------------------------------------------
  Tensor& fill_(Scalar value);
  Tensor& zero_() { return fill_(0); }
  Tensor& add_(const Tensor& other, Scalar alpha = 1);
  Tensor& add_(Scalar other);
  Tensor& sub_(const Tensor& other, Scalar alpha = 1);
  Tensor& sub_(Scalar other);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(Scalar other);
  Tensor& div_(const Tensor& other);
  Tensor& div_(Scalar other);
  Tensor& pow_(Scalar exponent);
  Tensor& neg_();
  Tensor& abs_();
  Tensor& exp_();
  Tensor& log_();
  Tensor& sqrt_();
  Tensor& rsqrt_();
  Tensor& relu_();
  Tensor& sigmoid_();
  Tensor& tanh_();
  Tensor& clamp_(std::optional<Scalar> min, std::optional<Scalar> max);
  Tensor& maximum_(const Tensor& other);
  Tensor& minimum_(const Tensor& other);
  Tensor& masked_fill_(const Tensor& mask, Scalar value);
  Tensor& scatter_add_(int64_t dim, const Tensor& index, const Tensor& src);

  // --- math (forwards to the free functions in ops.h) ---------------------------------
  Tensor add(const Tensor& other, Scalar alpha = 1) const;
  Tensor sub(const Tensor& other, Scalar alpha = 1) const;
  Tensor mul(const Tensor& other) const;
  Tensor div(const Tensor& other) const;
  Tensor pow(Scalar exponent) const;
  Tensor neg() const;
  Tensor abs() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor rsqrt() const;
  Tensor relu() const;
  Tensor sigmoid() const;
  Tensor tanh() const;
  Tensor clamp(std::optional<Scalar> min, std::optional<Scalar> max) const;
  Tensor sum(const Shape& dims = {}, bool keepdim = false) const;
  Tensor mean(const Shape& dims = {}, bool keepdim = false) const;
  Tensor max() const;
  Tensor min() const;
  Tensor argmax(std::optional<int64_t> dim = {}, bool keepdim = false) const;
  Tensor matmul(const Tensor& other) const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;

  // PyTorch-style text: tensor([[1., 2.], [3., 4.]]) with dtype/device suffixes.
  std::string str() const;

  // --- autograd (history is recorded by the autograd module, <ember/autograd/autograd.h>) --
  bool requires_grad() const;
  // Marks a leaf as needing gradients (torch's requires_grad_); not for tensors with history.
  Tensor& requires_grad_(bool requires_grad = true);
  // The gradient accumulated by backward passes; undefined until one reaches this tensor.
  const Tensor& grad() const;
  // Replaces the gradient (optimizers zero or drop it; DDP points it into its buckets).
  void set_grad(const Tensor& grad) const;
  // True for tensors created by the user rather than by a recorded op.
  bool is_leaf() const;
  // The node that produced this tensor in the autograd graph (null for leaves).
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  // Back-propagates from this tensor; `gradient` may be omitted for one-element tensors.
  void backward(const Tensor& gradient = {}, bool retain_graph = false,
                bool create_graph = false) const;
  // Keeps the gradient of a non-leaf in grad() after backward.
  void retain_grad() const;
  // Runs `hook` on the gradient flowing into this tensor; it may return a replacement.
  void register_hook(std::function<Tensor(const Tensor&)> hook) const;
  // Runs `hook` on a leaf once its grad() is fully accumulated for the current backward pass.
  void register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const;
  // The autograd state (null when the tensor never took part in autograd) and its creation.
  AutogradMeta* autograd_meta() const { return impl().autograd.get(); }
  AutogradMeta& ensure_autograd_meta() const;
  // A non-owning reference to the autograd state, for hooks that must not keep it alive.
  std::weak_ptr<AutogradMeta> weak_autograd_meta() const;

 private:
  struct Impl {
    Storage storage;
    DType dtype = kF32;
    Shape sizes;
    Shape strides;
    int64_t offset = 0;
    int64_t numel = 0;
    bool wrapped_number = false;
    std::shared_ptr<AutogradMeta> autograd;
  };
  // Inline: every accessor goes through it, on every op's path.
  Impl& impl() const {
    if (!impl_) [[unlikely]]
      throw_undefined();
    return *impl_;
  }
  [[noreturn]] static void throw_undefined();
  std::shared_ptr<Impl> impl_;
};

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, Scalar b);
Tensor operator-(const Tensor& a, Scalar b);
Tensor operator*(const Tensor& a, Scalar b);
Tensor operator/(const Tensor& a, Scalar b);
Tensor operator+(Scalar a, const Tensor& b);
Tensor operator-(Scalar a, const Tensor& b);
Tensor operator*(Scalar a, const Tensor& b);
Tensor operator/(Scalar a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor& operator+=(Tensor& a, const Tensor& b);
Tensor& operator-=(Tensor& a, const Tensor& b);
Tensor& operator*=(Tensor& a, const Tensor& b);
Tensor& operator/=(Tensor& a, const Tensor& b);
Tensor& operator+=(Tensor& a, Scalar b);
Tensor& operator-=(Tensor& a, Scalar b);
Tensor& operator*=(Tensor& a, Scalar b);
Tensor& operator/=(Tensor& a, Scalar b);

std::ostream& operator<<(std::ostream& out, const Tensor& t);

// What autograd keeps per tensor: the tensor module carries it, autograd/ gives it meaning.
struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;                                     // leaves (and retain_grad): accumulated gradient
  std::shared_ptr<autograd::Node> grad_fn;         // non-leaves: the op that produced the tensor
  uint32_t output_nr = 0;                          // which output of grad_fn this tensor is
  std::weak_ptr<autograd::Node> grad_accumulator;  // leaves: the node accumulating into grad
  std::vector<std::function<Tensor(const Tensor&)>> grad_hooks;  // leaves: run before accumulating
  std::vector<std::function<void(const Tensor&)>> post_accumulate_hooks;  // leaves: run after
  // Leaves whose reduced gradient lives on another rank alone (ZeRO-2's shard_gradients): that
  // rank, until this tensor gets a gradient of its own again; -1 otherwise.
  int grad_held_by_rank = -1;
};

template <typename T>
std::vector<T> Tensor::to_vector() const {
  const Tensor host = to(kCPU, dtype_of<T>).contiguous();
  const T* data = host.data_ptr<T>();
  return std::vector<T>(data, data + host.numel());
}

}  // namespace ember
