// <epmoe/npy.h> on data/npy.h's writer (one .npy writer for the tool and the API).
#include <epmoe/npy.h>

#include "data/npy.h"

namespace epmoe {

void write_npy(const std::string& path, TensorView array) {
  array.require_data("write_npy(" + path + ")");
  write_npy(std::filesystem::path(path), array);
}

}  // namespace epmoe
