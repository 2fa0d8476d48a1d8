#include "comm/algorithm.h"

#include <chrono>
#include <string>

#include "comm/tag.h"
#include "core/error.h"

namespace epmoe::comm {

namespace detail {

void check_common(const char* collective, std::uint64_t tag, std::chrono::milliseconds timeout) {
  validate_collective_tag(collective, tag);
  if (timeout.count() <= 0) {
    throw ConfigError(std::string(collective) + ": timeout = " + std::to_string(timeout.count()) + " ms: must be > 0");
  }
}

void check_count(const char* collective, const char* field, std::int64_t count) {
  if (count < 0) {
    throw ConfigError(std::string(collective) + ": " + field + " = " + std::to_string(count) + ": must be >= 0");
  }
}

void check_buffer(const char* collective, const char* field, const void* data, std::int64_t num_bytes) {
  if (num_bytes > 0 && data == nullptr) {
    throw ConfigError(std::string(collective) + ": " + field + " is null but " + std::to_string(num_bytes) +
                      " bytes are needed");
  }
}

transport::NativeCollectives& require_native(transport::Communicator& comm, const char* collective) {
  transport::NativeCollectives* native = comm.native_collectives();
  if (native == nullptr) {
    throw ConfigError(std::string(collective) + ": algorithm = native, but the " + std::string(comm.transport_name()) +
                      " transport has no native collectives (only mpi has)");
  }
  return *native;
}

void run_native(const std::string& name, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const PeerError& e) {
    throw PeerError(name + ": " + e.what());
  }
}

std::string collective_name(const char* collective, std::uint32_t tag) {
  return std::string(collective) + " tag " + std::to_string(tag);
}

}  // namespace detail
}  // namespace epmoe::comm
