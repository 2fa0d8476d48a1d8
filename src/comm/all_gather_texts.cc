#include "comm/all_gather_texts.h"

#include <algorithm>
#include <cstring>

#include "comm/all_gather.h"

namespace epmoe::comm {

std::vector<std::string> all_gather_texts(transport::Communicator& comm, const std::string& own, std::uint32_t tag,
                                          std::chrono::milliseconds timeout) {
  const auto size = static_cast<std::size_t>(comm.size());
  const std::int64_t own_length = static_cast<std::int64_t>(own.size());
  std::vector<std::int64_t> lengths(size);
  ring_all_gather(comm, {.input = &own_length,
                         .output = lengths.data(),
                         .num_elements_per_rank = 1,
                         .dtype = DType::i64,
                         .tag = tag,
                         .timeout = timeout})
      .wait();
  const std::int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  std::vector<std::string> texts(size);
  if (longest == 0) return texts;
  std::string padded = own;
  padded.resize(static_cast<std::size_t>(longest), '\0');
  std::string all(size * static_cast<std::size_t>(longest), '\0');
  // fp8_e4m3: any one-byte type; the collective moves bytes.
  ring_all_gather(comm, {.input = padded.data(),
                         .output = all.data(),
                         .num_elements_per_rank = longest,
                         .dtype = DType::fp8_e4m3,
                         .tag = tag + 1,
                         .timeout = timeout})
      .wait();
  for (std::size_t r = 0; r < size; ++r) {
    texts[r] = all.substr(r * static_cast<std::size_t>(longest), static_cast<std::size_t>(lengths[r]));
  }
  return texts;
}

}  // namespace epmoe::comm
