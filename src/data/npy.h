// NumPy .npy files (format versions 1.0, 2.0 and 3.0): the exchange format
// between epmoe and Python. epmoe reads and writes little-endian, C-order
// float32 ('<f4'), int32 ('<i4') and int64 ('<i8') arrays, which is what
// np.save writes for those dtypes on every common platform.
//
// Every problem with a file is an epmoe::FileError whose one-line message
// names the file and the rule it breaks, and says how to fix it from numpy
// when there is a one-line fix ("x.npy: dtype '<f8' (float64); epmoe reads
// float32 '<f4'; convert with x.astype(np.float32)").
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <epmoe/dtype.h>

#include "core/tensor.h"

namespace epmoe {

// A shape an input file must have. A dimension of kAnyDim is free (it is
// read from this file); `dim_names` name every dimension ("E", "H", "F") and
// `source` says where the fixed ones came from ("gate.npy and x.npy"), so
// a mismatch reads
//   "wi0.npy: shape [4, 8, 6], expected [4, 8, 5] (E, H, F) from gate.npy and wi0.npy".
struct ExpectedShape {
  static constexpr std::int64_t kAnyDim = -1;

  std::vector<std::int64_t> dims;
  std::vector<std::string> dim_names;  // one per dim, or empty
  std::string source;                  // may be empty

  bool matches(const Shape& shape) const;
  std::string to_string() const;  // "[4, 8, F] (E, H, F) from gate.npy and x.npy"
};

// The parsed header of an .npy file.
struct NpyHeader {
  int major_version = 1;
  std::string descr;  // e.g. "<f4"
  bool fortran_order = false;
  Shape shape;
  std::int64_t data_offset_bytes = 0;  // where the array bytes start
};

// Reads and checks the header only (magic, version, dict); does not check
// the dtype or the data size.
NpyHeader read_npy_header(const std::filesystem::path& path);

// Reads an array of dtype `expected_dtype` (f32, i32 or i64).
Tensor read_npy(const std::filesystem::path& path, DType expected_dtype);
// Same, and the shape must match `expected_shape`.
Tensor read_npy(const std::filesystem::path& path, DType expected_dtype, const ExpectedShape& expected_shape);

// Writes `tensor` (f32, i32 or i64) atomically: the bytes go to a temporary
// file in the same directory, which is renamed over `path` only when complete,
// so a reader never sees a half-written array. On error the temporary file is
// removed and a FileError is thrown.
// `array` must be C-contiguous (a Tensor, or a view of a caller's buffer).
void write_npy(const std::filesystem::path& path, TensorView array);
// A Tensor, a temporary included (a view of one is refused elsewhere, as it
// would dangle; here it lives through the call).
inline void write_npy(const std::filesystem::path& path, const Tensor& tensor) { write_npy(path, tensor.view()); }

// The numpy descr ("<f4") of a dtype epmoe writes; FileError-free, throws
// InternalError for bf16 / fp8 (which have no numpy dtype).
std::string npy_descr(DType dtype);

}  // namespace epmoe
