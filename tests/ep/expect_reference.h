// The check every EP test makes against the double reference: the same
// expert ids, and y and every gradient within 1e-5 relative (DESIGN.md §3).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "ep_harness.h"
#include "reference_moe.h"

namespace epmoe::testing {

inline void expect_matches_reference(const EpRunResult& run, const ReferenceResult& ref, const std::string& what) {
  EXPECT_EQ(ids_of(run.topk_ids), ref.topk_ids) << what;
  EXPECT_LE(relative_error(run.y, ref.y), 1e-5) << what << " y";
  EXPECT_LE(relative_error(run.grads.dx, ref.dx), 1e-5) << what << " dx";
  EXPECT_LE(relative_error(run.grads.dgate, ref.dgate), 1e-5) << what << " dgate";
  EXPECT_LE(relative_error(run.grads.dwi0, ref.dwi0), 1e-5) << what << " dwi0";
  EXPECT_LE(relative_error(run.grads.dwi1, ref.dwi1), 1e-5) << what << " dwi1";
  EXPECT_LE(relative_error(run.grads.dwo, ref.dwo), 1e-5) << what << " dwo";
}

}  // namespace epmoe::testing
