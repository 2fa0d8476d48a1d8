// TensorView / MutableTensorView (include/epmoe/tensor_view.h): the layout a
// view describes, the sub-views of leading rows, the contiguity rule, and
// the conversions from Tensor and from a mutable view.
#include <epmoe/tensor_view.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace epmoe {
namespace {

// Fixed-size storage: copying a view copies no heap memory (and cannot throw).
static_assert(std::is_trivially_copyable_v<TensorView>);
static_assert(std::is_trivially_copyable_v<MutableTensorView>);
static_assert(std::is_convertible_v<MutableTensorView, TensorView>);
static_assert(!std::is_convertible_v<TensorView, MutableTensorView>);
// A view of a temporary Tensor would dangle: there is none.
static_assert(std::is_convertible_v<const Tensor&, TensorView>);
static_assert(!std::is_convertible_v<Tensor&&, TensorView>);

TEST(TensorView, DescribesCallerMemoryInCOrder) {
  std::vector<float> memory(2 * 3 * 4);
  const TensorView view(memory.data(), DType::f32, {2, 3, 4});
  EXPECT_EQ(view.rank(), 3);
  EXPECT_EQ(view.numel(), 24);
  EXPECT_EQ(view.size_bytes(), 96);
  EXPECT_EQ(view.dim(0), 2);
  EXPECT_EQ(view.dim(-1), 4);
  EXPECT_EQ(view.stride(0), 12);
  EXPECT_EQ(view.stride(1), 4);
  EXPECT_EQ(view.stride(2), 1);
  EXPECT_TRUE(view.is_contiguous());
  EXPECT_TRUE(view.has_shape({2, 3, 4}));
  EXPECT_FALSE(view.has_shape({2, 12}));
  EXPECT_EQ(view.data<float>(), memory.data());
  EXPECT_FALSE(view.empty());
  EXPECT_THROW(view.dim(3), InternalError);
  EXPECT_THROW(view.data<std::int32_t>(), InternalError);  // the dtype is checked
}

TEST(TensorView, RowsAreSubViewsOfTheSameMemory) {
  std::vector<float> memory(5 * 3);
  for (std::size_t i = 0; i < memory.size(); ++i) memory[i] = static_cast<float>(i);
  const TensorView view(memory.data(), DType::f32, {5, 3});
  const TensorView middle = view.rows(1, 4);
  EXPECT_TRUE(middle.has_shape({3, 3}));
  EXPECT_EQ(middle.data<float>(), memory.data() + 3);
  EXPECT_EQ(middle.data<float>()[0], 3.0f);
  EXPECT_TRUE(middle.is_contiguous());
  const TensorView none = view.rows(5, 5);  // no rows: still a [0, 3] view, contiguous, empty
  EXPECT_TRUE(none.has_shape({0, 3}));
  EXPECT_TRUE(none.empty());
  EXPECT_TRUE(none.is_contiguous());
  EXPECT_THROW(view.rows(2, 6), InternalError);
  EXPECT_THROW(view.rows(3, 2), InternalError);
}

TEST(TensorView, StridedViewsAreNotContiguousAndAreRefusedByName) {
  std::vector<float> memory(4 * 6);
  // Every other row of a [4, 6] array: [2, 6] with a row stride of 12.
  const std::int64_t shape[] = {2, 6}, strides[] = {12, 1};
  const TensorView every_other(memory.data(), DType::f32, shape, strides);
  EXPECT_FALSE(every_other.is_contiguous());
  // The transpose of a [6, 4] array.
  const std::int64_t t_shape[] = {4, 6}, t_strides[] = {1, 4};
  const TensorView transposed(memory.data(), DType::f32, t_shape, t_strides);
  EXPECT_FALSE(transposed.is_contiguous());
  try {
    transposed.require_contiguous("moe layer: wi0");
    ADD_FAILURE() << "a transposed view passed";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("moe layer: wi0 is not C-contiguous (shape [4, 6], strides [1, 4]", 0), 0u)
        << e.what();
  }
  EXPECT_THROW(transposed.span<float>(), UsageError);
  // Extent-1 dimensions may have any stride (as PyTorch's unsqueeze gives).
  const std::int64_t u_shape[] = {4, 1, 6}, u_strides[] = {6, 99, 1};
  EXPECT_TRUE(TensorView(memory.data(), DType::f32, u_shape, u_strides).is_contiguous());
}

TEST(TensorView, DefaultIsEmptyMeaningAbsent) {
  const TensorView absent;
  EXPECT_TRUE(absent.empty());
  EXPECT_EQ(absent.numel(), 0);
  EXPECT_EQ(absent.raw(), nullptr);
  EXPECT_TRUE(absent.is_contiguous());
}

TEST(TensorView, RankIsBoundedSoAViewNeverAllocates) {
  std::vector<float> memory(1);
  const std::int64_t five[] = {1, 1, 1, 1, 1};
  EXPECT_THROW(TensorView(memory.data(), DType::f32, five), InternalError);
  EXPECT_NO_THROW(TensorView(memory.data(), DType::f32, {1, 1, 1, 1}));
}

TEST(TensorView, TensorsConvertToViewsOfTheirMemory) {
  Tensor t = Tensor::zeros(DType::f32, {3, 2});
  const TensorView view = t;  // implicit: a call taking a view takes a Tensor
  EXPECT_EQ(view.raw(), t.raw());
  EXPECT_TRUE(view.has_shape({3, 2}));
  EXPECT_EQ(view.dtype(), DType::f32);
  MutableTensorView out = t.mutable_view();
  out.rows(2, 3).data<float>()[1] = 5.0f;
  EXPECT_EQ(t.data<float>()[5], 5.0f);
  const TensorView read = out;  // a mutable view reads too
  EXPECT_EQ(read.data<float>()[5], 5.0f);
  const Tensor empty;
  EXPECT_TRUE(empty.view().empty());
}

}  // namespace
}  // namespace epmoe
