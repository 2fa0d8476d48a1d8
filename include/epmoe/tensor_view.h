// TensorView / MutableTensorView: a caller's memory as epmoe reads (or
// writes) it, without a copy: a data pointer, a dtype, a shape and strides
// in elements. Neither owns anything; the memory must outlive every use the
// call documents (a layer keeps x and the weights' views until backward).
//
// Why views: an engine that already holds its weights and activations
// (PyTorch, a serving engine, a numpy array) passes them as they are, so
// epmoe allocates only what it computes (issue 17). epmoe's own allocations
// stay owning Tensors (src/core/tensor.h), which convert to a view.
//
//   std::vector<float> wi0(num_experts * hidden * ffn);
//   epmoe::TensorView view(wi0.data(), epmoe::DType::f32, {num_experts, hidden, ffn});
//
// The shape lives inside the view (at most kMaxViewRank dimensions), so
// making or copying one never allocates. The engine computes on C-contiguous
// data; a strided view (e.g. a transposed or sliced-column PyTorch tensor) is
// described faithfully and refused by require_contiguous() with a message
// naming the tensor and its strides. An empty view (default-constructed, or
// zero elements) stands for "absent" where an input is optional (a bias).
//
// Public and std-only; the few out-of-line members (errors, strings) are
// implemented in src/core/tensor_view.cc.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include <epmoe/dtype.h>

namespace epmoe {

// Enough for every tensor of an MoE layer ([E, H, F] weights are the deepest).
inline constexpr int kMaxViewRank = 4;

namespace detail {

// Out of line so that this header needs no error classes: each throws
// epmoe::InternalError (a bug in the caller of the view inside epmoe) with
// the values named.
[[noreturn]] void throw_view_dtype_mismatch(DType view, DType requested);
[[noreturn]] void throw_view_bad_rank(std::size_t rank);
[[noreturn]] void throw_view_bad_dim(int index, int rank);
[[noreturn]] void throw_view_bad_rows(std::int64_t begin, std::int64_t end, std::int64_t num_rows);
[[noreturn]] void throw_view_not_contiguous(std::string_view what, std::span<const std::int64_t> shape,
                                            std::span<const std::int64_t> strides);
[[noreturn]] void throw_view_null_data(std::string_view what, std::span<const std::int64_t> shape);
// "[2, 3, 4]"
std::string dims_to_string(std::span<const std::int64_t> dims);

template <bool kMutable>
class BasicTensorView {
 public:
  using Pointer = std::conditional_t<kMutable, void*, const void*>;
  template <typename T>
  using Element = std::conditional_t<kMutable, T, const T>;

  BasicTensorView() = default;  // empty: absent
  // C-contiguous (row-major) data of `shape`.
  BasicTensorView(Pointer data, DType dtype, std::span<const std::int64_t> shape) : data_(data), dtype_(dtype) {
    set_shape(shape);
    std::int64_t stride = 1;
    for (int d = rank_; d-- > 0;) {
      strides_[d] = stride;
      stride *= shape_[d];
    }
  }
  BasicTensorView(Pointer data, DType dtype, std::initializer_list<std::int64_t> shape)
      : BasicTensorView(data, dtype, std::span<const std::int64_t>(shape.begin(), shape.size())) {}
  // Typed, C-contiguous: the dtype follows the element type (float: f32,
  // std::int32_t: i32, ...): TensorView(x.data(), {n, h}).
  template <typename T>
  requires(!std::is_void_v<T> && (!kMutable || !std::is_const_v<T>))
      BasicTensorView(T* data, std::initializer_list<std::int64_t> shape)
      : BasicTensorView(static_cast<Pointer>(data), dtype_of<std::remove_const_t<T>>(), shape) {}
  // Any layout: strides[d] elements between neighbours along dimension d.
  BasicTensorView(Pointer data, DType dtype, std::span<const std::int64_t> shape, std::span<const std::int64_t> strides)
      : data_(data), dtype_(dtype) {
    set_shape(shape);
    if (strides.size() != shape.size()) throw_view_bad_rank(strides.size());
    for (int d = 0; d < rank_; ++d) strides_[d] = strides[d];
  }

  // A mutable view reads as well as it writes.
  operator BasicTensorView<false>() const requires kMutable {
    return BasicTensorView<false>(data_, dtype_, shape(), strides());
  }

  DType dtype() const { return dtype_; }
  int rank() const { return rank_; }
  std::span<const std::int64_t> shape() const { return {shape_.data(), static_cast<std::size_t>(rank_)}; }
  std::span<const std::int64_t> strides() const { return {strides_.data(), static_cast<std::size_t>(rank_)}; }
  std::int64_t dim(int i) const { return shape_[index(i)]; }  // negative i counts from the end
  std::int64_t stride(int i) const { return strides_[index(i)]; }
  std::int64_t numel() const {
    if (data_ == nullptr && rank_ == 0) return 0;  // default-constructed
    std::int64_t numel = 1;
    for (int d = 0; d < rank_; ++d) numel *= shape_[d];
    return numel;
  }
  // Bytes of the elements (of the memory spanned, when contiguous).
  std::int64_t size_bytes() const { return numel() * static_cast<std::int64_t>(dtype_size_bytes(dtype_)); }
  bool empty() const { return data_ == nullptr || numel() == 0; }

  bool has_shape(std::span<const std::int64_t> shape) const {
    if (shape.size() != static_cast<std::size_t>(rank_)) return false;
    for (int d = 0; d < rank_; ++d)
      if (shape[d] != shape_[d]) return false;
    return true;
  }
  bool has_shape(std::initializer_list<std::int64_t> shape) const {
    return has_shape(std::span<const std::int64_t>(shape.begin(), shape.size()));
  }

  // Row-major with no gaps. Strides of extent-1 dimensions do not matter
  // (as in PyTorch), and a view of no elements is always contiguous.
  bool is_contiguous() const {
    if (numel() == 0) return true;
    std::int64_t expected = 1;
    for (int d = rank_; d-- > 0;) {
      if (shape_[d] != 1 && strides_[d] != expected) return false;
      expected *= shape_[d];
    }
    return true;
  }
  // Throws epmoe::UsageError "<what> is not C-contiguous (shape [..], strides
  // [..]): ..." unless is_contiguous(); `what` names the tensor for the
  // caller ("moe layer: wi0").
  void require_contiguous(std::string_view what) const {
    if (!is_contiguous()) throw_view_not_contiguous(what, shape(), strides());
  }

  // Throws epmoe::UsageError "<what>: null data pointer for a 16x8 view"
  // when the view has elements but no memory (a caller's unset pointer,
  // which reading would crash on). Every entry of the API checks each view it
  // is given with this before anything reads it. A null view of no elements
  // is an absent (or empty) one and passes.
  void require_data(std::string_view what) const {
    if (data_ == nullptr && numel() != 0) throw_view_null_data(what, shape());
  }

  Pointer raw() const { return data_; }
  // Typed access; InternalError on a dtype mismatch.
  template <typename T>
  Element<T>* data() const {
    if (dtype_of<std::remove_const_t<T>>() != dtype_)
      throw_view_dtype_mismatch(dtype_, dtype_of<std::remove_const_t<T>>());
    return static_cast<Element<T>*>(data_);
  }
  // The elements in memory order, for a contiguous view.
  template <typename T>
  std::span<Element<T>> span() const {
    if (!is_contiguous()) throw_view_not_contiguous("tensor view span()", shape(), strides());
    return {data<T>(), static_cast<std::size_t>(numel())};
  }

  // Leading rows [begin, end): the same memory, dim(0) = end - begin.
  BasicTensorView rows(std::int64_t begin, std::int64_t end) const {
    if (rank_ < 1 || begin < 0 || begin > end || end > shape_[0])
      throw_view_bad_rows(begin, end, rank_ < 1 ? -1 : shape_[0]);
    BasicTensorView out = *this;
    out.shape_[0] = end - begin;
    if (data_ != nullptr) {
      using Byte = std::conditional_t<kMutable, std::byte, const std::byte>;
      out.data_ = static_cast<Byte*>(data_) + begin * strides_[0] * static_cast<std::int64_t>(dtype_size_bytes(dtype_));
    }
    return out;
  }

 private:
  void set_shape(std::span<const std::int64_t> shape) {
    if (shape.size() > static_cast<std::size_t>(kMaxViewRank)) throw_view_bad_rank(shape.size());
    rank_ = static_cast<int>(shape.size());
    for (int d = 0; d < rank_; ++d) shape_[d] = shape[d];
  }
  std::size_t index(int i) const {
    const int d = i < 0 ? i + rank_ : i;
    if (d < 0 || d >= rank_) throw_view_bad_dim(i, rank_);
    return static_cast<std::size_t>(d);
  }

  Pointer data_ = nullptr;  // not owned
  DType dtype_ = DType::f32;
  int rank_ = 0;
  std::array<std::int64_t, kMaxViewRank> shape_{};
  std::array<std::int64_t, kMaxViewRank> strides_{};  // in elements
};

}  // namespace detail

// Read-only: inputs (x, dy, the gate, the experts' weights, a bias).
using TensorView = detail::BasicTensorView<false>;
// Writable: outputs a caller provides.
using MutableTensorView = detail::BasicTensorView<true>;

}  // namespace epmoe
