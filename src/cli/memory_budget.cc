#include "cli/memory_budget.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace epmoe::cli {

std::int64_t memory_budget_bytes() {
  std::int64_t budget = std::numeric_limits<std::int64_t>::max();
  const long pages = ::sysconf(_SC_PHYS_PAGES), page_bytes = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_bytes > 0 && pages <= budget / page_bytes) budget = std::int64_t{pages} * page_bytes;
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
      limit.rlim_cur < static_cast<rlim_t>(budget)) {
    budget = static_cast<std::int64_t>(limit.rlim_cur);
  }
  return budget;
}

void check_fits_in_memory(const std::string& setting, std::int64_t bytes) {
  const std::int64_t budget = memory_budget_bytes();
  if (bytes > budget) {
    throw ConfigError(setting + ": needs " + std::to_string(bytes) + " bytes, more than this machine's memory (" +
                      std::to_string(budget) + " bytes)");
  }
}

}  // namespace epmoe::cli
