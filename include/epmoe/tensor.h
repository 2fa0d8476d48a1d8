// epmoe::Tensor: an owning, 64-byte aligned, C-order buffer with a shape and
// a dtype: what epmoe allocates and hands back when the caller gave no
// buffer of its own (a layer's outputs, a dispatch's rows). What a caller
// owns comes in as a TensorView (<epmoe/tensor_view.h>); a Tensor converts
// to one implicitly, so a call that reads a view takes a Tensor as well.
// Move-only (copies are explicit: clone()), so a big buffer is never copied
// by accident. A tensor may be attributed to a MemoryLedger
// (<epmoe/memory_ledger.h>) under a name; the ledger then sees its bytes
// from construction to destruction.
//
// Why 64 bytes: one cache line and one AVX-512 register, which oneDNN and
// epmoe's own loops load fastest. Memory comes from a per-thread cache of
// large blocks (src/core/buffer_cache.h): a first touch costs ~11 us per
// 4 KiB page on the machines epmoe is measured on (DESIGN.md §7).
//
// Public and std-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include <epmoe/dtype.h>
#include <epmoe/tensor_view.h>

namespace epmoe {

class MemoryLedger;

using Shape = std::vector<std::int64_t>;

std::int64_t shape_numel(const Shape& shape);
std::string shape_to_string(const Shape& shape);  // "[2, 3, 4]"

class Tensor {
 public:
  Tensor() = default;
  // Uninitialised contents. `ledger` (optional, not owned, must outlive the
  // tensor) records the bytes under `ledger_name`.
  Tensor(DType dtype, Shape shape, MemoryLedger* ledger = nullptr, std::string ledger_name = {});
  static Tensor zeros(DType dtype, Shape shape, MemoryLedger* ledger = nullptr, std::string ledger_name = {});

  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  ~Tensor();

  Tensor clone() const;  // same dtype/shape/bytes; not attributed to a ledger
  void fill_zero();

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  std::int64_t dim(int i) const;  // negative i counts from the end
  int rank() const { return static_cast<int>(shape_.size()); }
  std::int64_t numel() const { return numel_; }
  std::int64_t size_bytes() const { return numel_ * static_cast<std::int64_t>(dtype_size_bytes(dtype_)); }
  bool empty() const { return numel_ == 0; }

  void* raw() { return data_; }
  const void* raw() const { return data_; }

  // Typed access; throws InternalError on a dtype mismatch.
  template <typename T>
  T* data() {
    if (dtype_of<T>() != dtype_) detail::throw_view_dtype_mismatch(dtype_, dtype_of<T>());
    return static_cast<T*>(data_);
  }
  template <typename T>
  const T* data() const {
    if (dtype_of<T>() != dtype_) detail::throw_view_dtype_mismatch(dtype_, dtype_of<T>());
    return static_cast<const T*>(data_);
  }
  template <typename T>
  std::span<T> span() {
    return {data<T>(), static_cast<std::size_t>(numel_)};
  }
  template <typename T>
  std::span<const T> span() const {
    return {data<T>(), static_cast<std::size_t>(numel_)};
  }

  // Views of this tensor's memory (valid while it lives and is not moved
  // from). Of a temporary there is none: it would dangle at the end of the
  // full expression, e.g. in a layer that keeps x until backward.
  TensorView view() const& { return TensorView(data_, dtype_, shape_); }
  TensorView view() const&& = delete;
  MutableTensorView mutable_view() & { return MutableTensorView(data_, dtype_, shape_); }
  operator MutableTensorView() & { return mutable_view(); }
  operator TensorView() const& { return view(); }
  operator TensorView() const&& = delete;

  // Same bytes, new shape with the same element count.
  void reshape(Shape shape);

  // Starts recording this tensor's bytes in `ledger` under `name` (e.g. when
  // a layer decides to keep a buffer for backward). At most one ledger.
  void attribute_to(MemoryLedger* ledger, std::string name);

 private:
  void release() noexcept;

  DType dtype_ = DType::f32;
  Shape shape_;
  std::int64_t numel_ = 0;
  void* data_ = nullptr;            // owned; release_buffer
  std::size_t capacity_bytes_ = 0;  // of the block data_ points to (>= the bytes used)
  MemoryLedger* ledger_ = nullptr;  // not owned
  std::string ledger_name_;
};

}  // namespace epmoe
