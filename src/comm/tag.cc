#include "comm/tag.h"

#include <sstream>

#include "core/error.h"

namespace epmoe::comm {

void validate_collective_tag(const char* what, std::uint64_t collective_tag) {
  if (collective_tag > kMaxCollectiveTag) {
    std::ostringstream msg;
    msg << what << ": tag = " << collective_tag << ": must be <= " << kMaxCollectiveTag << " (24 bits; comm/tag.h)";
    throw ConfigError(msg.str());
  }
}

}  // namespace epmoe::comm
