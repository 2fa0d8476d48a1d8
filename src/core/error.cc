#include "core/error.h"

namespace epmoe::detail {

void throw_check_failure(const char* file, int line, const std::string& what) {
  std::ostringstream msg;
  msg << "epmoe internal error at " << file << ":" << line << ": " << what;
  throw InternalError(msg.str());
}

}  // namespace epmoe::detail
