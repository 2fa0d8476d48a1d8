// Ranks as threads with one compute thread each, the comm threads tests'
// launcher options: the collectives need no OpenMP team inside a rank.
#pragma once

#include "transport/threads/launcher.h"

namespace epmoe::comm::testing {

inline transport::threads::ThreadsOptions one_thread_per_rank() {
  transport::threads::ThreadsOptions options;
  options.compute_threads_per_rank = 1;
  return options;
}

}  // namespace epmoe::comm::testing
