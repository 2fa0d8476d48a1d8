// The out-of-line members of include/epmoe/tensor_view.h: the errors, which
// need epmoe's exception classes (the public header stays std-only).
#include <epmoe/tensor_view.h>

#include "core/error.h"

namespace epmoe::detail {

std::string dims_to_string(std::span<const std::int64_t> dims) {
  std::string out = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(dims[i]);
  }
  return out + "]";
}

void throw_view_dtype_mismatch(DType view, DType requested) {
  throw InternalError("tensor view: data<" + std::string(dtype_name(requested)) + ">() of a view of dtype " +
                      std::string(dtype_name(view)));
}

void throw_view_bad_rank(std::size_t rank) {
  throw InternalError("tensor view: " + std::to_string(rank) +
                      " dimensions (or strides that do not match the shape); " + "a view has at most " +
                      std::to_string(kMaxViewRank));
}

void throw_view_bad_dim(int index, int rank) {
  throw InternalError("tensor view: dimension " + std::to_string(index) + " of a view of rank " + std::to_string(rank));
}

void throw_view_bad_rows(std::int64_t begin, std::int64_t end, std::int64_t num_rows) {
  throw InternalError("tensor view: rows(" + std::to_string(begin) + ", " + std::to_string(end) + ") of " +
                      (num_rows < 0 ? std::string("a view of rank 0") : std::to_string(num_rows) + " rows"));
}

void throw_view_not_contiguous(std::string_view what, std::span<const std::int64_t> shape,
                               std::span<const std::int64_t> strides) {
  throw UsageError(std::string(what) + " is not C-contiguous (shape " + dims_to_string(shape) + ", strides " +
                   dims_to_string(strides) +
                   " in elements): epmoe computes on row-major data without gaps; pass a contiguous copy");
}

void throw_view_null_data(std::string_view what, std::span<const std::int64_t> shape) {
  std::string dims;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) dims += 'x';
    dims += std::to_string(shape[i]);
  }
  throw UsageError(std::string(what) + ": null data pointer for a " +
                   (shape.size() == 1 ? "view of " + dims + " elements" : dims + " view") +
                   ": a view with elements needs their memory (an absent input is an empty view)");
}

}  // namespace epmoe::detail
