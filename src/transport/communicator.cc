#include "transport/communicator.h"

#include <sstream>

namespace epmoe::transport {

std::string describe_wait(int rank, std::string_view what, int peer, Tag tag) {
  std::ostringstream out;
  out << "rank " << rank << ": " << what << " peer " << peer << ", tag " << tag;
  return out.str();
}

}  // namespace epmoe::transport
