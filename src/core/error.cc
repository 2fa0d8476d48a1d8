#include "core/error.h"

namespace epmoe {

int exit_code_for(const std::exception_ptr& error) {
  if (!error) return kExitInternalError;
  try {
    std::rethrow_exception(error);
  } catch (const Error&) {
    return kExitBadInput;
  } catch (...) {
    return kExitInternalError;
  }
}

namespace detail {

void throw_check_failure(const char* file, int line, const std::string& what) {
  std::ostringstream msg;
  msg << "epmoe internal error at " << file << ":" << line << ": " << what;
  throw InternalError(msg.str());
}

}  // namespace detail
}  // namespace epmoe
