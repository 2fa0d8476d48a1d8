#include "array_views.h"

#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>
#include <vector>

namespace nb = nanobind;

namespace epmoe::python {
namespace {

const char* numpy_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "float32";
    case DType::i32:
      return "int32";
    case DType::i64:
      return "int64";
    default:
      return "?";
  }
}

nb::dlpack::dtype dlpack_dtype(DType dtype) {
  switch (dtype) {
    case DType::i32:
      return nb::dtype<std::int32_t>();
    case DType::i64:
      return nb::dtype<std::int64_t>();
    default:
      return nb::dtype<float>();
  }
}

// str(value), or "?" when that fails.
std::string text_of(nb::handle value) {
  const nb::object text = nb::steal(PyObject_Str(value.ptr()));
  const char* utf8 = text.is_valid() ? PyUnicode_AsUTF8(text.ptr()) : nullptr;
  if (utf8 == nullptr) {
    PyErr_Clear();
    return "?";
  }
  return utf8;
}

// "<class 'torch.Tensor'>, dtype torch.float64, shape torch.Size([4, 8])":
// what the caller passed, from the attributes numpy arrays and torch tensors
// share.
std::string describe(nb::handle value) {
  std::string text = text_of(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(value.ptr()))));
  for (const char* attribute : {"dtype", "shape", "device"}) {
    const nb::object found = nb::steal(PyObject_GetAttrString(value.ptr(), attribute));
    if (!found.is_valid()) {
      PyErr_Clear();
      continue;
    }
    text += std::string(", ") + attribute + " " + text_of(found);
  }
  return text;
}

bool attribute_is_true(nb::handle value, const char* attribute) {
  const nb::object found = nb::steal(PyObject_GetAttrString(value.ptr(), attribute));
  if (!found.is_valid()) {
    PyErr_Clear();
    return false;
  }
  return PyObject_IsTrue(found.ptr()) == 1;
}

[[noreturn]] void refuse(const char* call, const char* name, const std::string& why) {
  throw nb::type_error((std::string(call) + ": " + name + " " + why).c_str());
}

template <typename Ref>
void import_array(nb::handle value, DType dtype, const char* call, const char* name, bool writable, Ref& ref) {
  const std::string expected = std::string("a C-contiguous ") + numpy_name(dtype) +
                               " CPU array (numpy, or a torch tensor) read in place, never converted";
  if (!nb::try_cast(value, ref, /*convert=*/false)) {
    PyErr_Clear();  // an export that raised (a meta tensor's __dlpack__)
    if (writable && nb::hasattr(value, "flags") && !attribute_is_true(value.attr("flags"), "writeable")) {
      refuse(call, name, "is read-only; an output buffer must be writable");
    }
    refuse(call, name, "must be " + expected + "; got " + describe(value));
  }
  if (ref.device_type() != nb::device::cpu::value) refuse(call, name, "is not on the CPU; got " + describe(value));
  if (ref.dtype() != dlpack_dtype(dtype)) refuse(call, name, "must be " + expected + "; got " + describe(value));
  if (ref.ndim() < 1 || ref.ndim() > static_cast<std::size_t>(kMaxViewRank)) {
    refuse(call, name, "must have 1 to " + std::to_string(kMaxViewRank) + " dimensions; got " + describe(value));
  }
}

template <typename View, typename Ref>
View view_of(const Ref& ref, DType dtype, const char* call, const char* name, nb::handle value) {
  std::vector<std::int64_t> shape(ref.ndim()), strides(ref.ndim());
  for (std::size_t d = 0; d < ref.ndim(); ++d) {
    shape[d] = static_cast<std::int64_t>(ref.shape(d));
    strides[d] = ref.stride(d);
  }
  const View view(ref.data(), dtype, shape, strides);
  if (!view.is_contiguous()) {
    refuse(call, name,
           "is not C-contiguous (shape " + detail::dims_to_string(shape) + ", strides " +
               detail::dims_to_string(strides) + " elements): epmoe reads it in place; pass a contiguous copy (" +
               describe(value) + ")");
  }
  return View(ref.data(), dtype, shape);
}

}  // namespace

TensorView input_view(nb::handle array, DType dtype, const char* call, const char* name, ArrayRef& ref) {
  import_array(array, dtype, call, name, /*writable=*/false, ref);
  return view_of<TensorView>(ref, dtype, call, name, array);
}

TensorView optional_input_view(nb::handle array, DType dtype, const char* call, const char* name, ArrayRef& ref) {
  if (array.is_none()) return TensorView();
  return input_view(array, dtype, call, name, ref);
}

MutableTensorView output_view(nb::handle array, DType dtype, const char* call, const char* name, MutableArrayRef& ref) {
  if (array.is_none()) return MutableTensorView();
  import_array(array, dtype, call, name, /*writable=*/true, ref);
  return view_of<MutableTensorView>(ref, dtype, call, name, array);
}

nb::object to_numpy(Tensor&& tensor) {
  std::vector<std::size_t> shape(tensor.shape().begin(), tensor.shape().end());
  const DType dtype = tensor.dtype();
  auto* owned = new Tensor(std::move(tensor));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  return nb::ndarray<nb::numpy>(owned->raw(), shape.size(), shape.data(), owner, nullptr, dlpack_dtype(dtype)).cast();
}

}  // namespace epmoe::python
