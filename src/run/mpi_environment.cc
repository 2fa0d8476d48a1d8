#include "run/mpi_environment.h"

#include <charconv>
#include <cstdlib>
#include <initializer_list>
#include <string_view>

namespace epmoe::run {
namespace {

// The first of `names` that is set to a positive integer (or zero for a rank).
std::optional<int> integer_variable(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const char* text = std::getenv(name);
    if (text == nullptr) continue;
    const std::string_view value(text);
    int parsed = 0;
    const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), parsed);
    if (error == std::errc() && end == value.data() + value.size() && parsed >= 0) return parsed;
  }
  return std::nullopt;
}

}  // namespace

std::optional<MpiLaunch> mpi_launch_from_environment() {
  const std::optional<int> size = integer_variable({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"});
  const std::optional<int> rank = integer_variable({"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"});
  if (!size || !rank || *size < 1) return std::nullopt;
  MpiLaunch launch;
  launch.world_size = *size;
  launch.world_rank = *rank;
  launch.local_size = integer_variable({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}).value_or(*size);
  if (launch.local_size < 1) launch.local_size = 1;
  return launch;
}

bool mpi_transport_built() {
#ifdef EPMOE_WITH_MPI_TRANSPORT
  return true;
#else
  return false;
#endif
}

}  // namespace epmoe::run
