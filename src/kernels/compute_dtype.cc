#include "kernels/compute_dtype.h"

#include "core/error.h"

namespace epmoe {

ComputeDType parse_compute_dtype(std::string_view key, std::string_view value) {
  if (value == "f32") return ComputeDType::f32;
  if (value == "bf16") return ComputeDType::bf16;
  throw ConfigError(std::string(key) + "=" + std::string(value) + ": must be one of f32, bf16");
}

std::string to_string(ComputeDType dtype) {
  switch (dtype) {
    case ComputeDType::f32:
      return "f32";
    case ComputeDType::bf16:
      return "bf16";
  }
  return "?";
}

}  // namespace epmoe
