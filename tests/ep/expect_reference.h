// The check every EP test makes against the double reference: the same
// expert ids, and y and every gradient within 1e-5 relative (DESIGN.md §3);
// and the check of two runs that must agree bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
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

// y, the expert ids and every gradient with the same bits.
inline void expect_same_bits(const EpRunResult& a, const EpRunResult& b, const std::string& what) {
  EXPECT_TRUE(same_bits(a.y, b.y)) << what << " y";
  EXPECT_TRUE(same_bits(a.topk_ids, b.topk_ids)) << what << " topk_ids";
  EXPECT_TRUE(same_bits(a.grads.dx, b.grads.dx)) << what << " dx";
  EXPECT_TRUE(same_bits(a.grads.dgate, b.grads.dgate)) << what << " dgate";
  EXPECT_TRUE(same_bits(a.grads.dwi0, b.grads.dwi0)) << what << " dwi0";
  EXPECT_TRUE(same_bits(a.grads.dwi1, b.grads.dwi1)) << what << " dwi1";
  EXPECT_TRUE(same_bits(a.grads.dwo, b.grads.dwo)) << what << " dwo";
}

}  // namespace epmoe::testing
