#include "core/file_error.h"

#include <cerrno>
#include <cstring>

#include <epmoe/error.h>

namespace epmoe {

std::string errno_text() { return std::strerror(errno); }

void throw_file_error(const std::filesystem::path& path, const std::string& rule) {
  throw FileError(path.string() + ": " + rule);
}

}  // namespace epmoe
