#include "transport/communicator.h"

#include <sstream>

namespace epmoe::transport {
namespace {
thread_local std::int64_t bytes_sent_by_this_thread = 0;
}  // namespace

std::int64_t this_thread_bytes_sent() { return bytes_sent_by_this_thread; }
void count_bytes_sent(std::int64_t num_bytes) { bytes_sent_by_this_thread += num_bytes; }

std::string describe_wait(int rank, std::string_view what, int peer, Tag tag) {
  std::ostringstream out;
  out << "rank " << rank << ": " << what << " peer " << peer << ", tag " << tag;
  return out.str();
}

}  // namespace epmoe::transport
