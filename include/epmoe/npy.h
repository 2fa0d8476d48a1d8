// Writing arrays as numpy .npy files, as `epmoe layer` writes its outputs
// (so an embedding program's arrays compare with that command's file for
// file, and numpy.load reads them).
#pragma once

#include <string>

#include <epmoe/tensor_view.h>

namespace epmoe {

// Writes a C-contiguous float32, int32 or int64 array atomically: the file
// appears whole or not at all. epmoe::FileError naming the path otherwise.
void write_npy(const std::string& path, TensorView array);

}  // namespace epmoe
