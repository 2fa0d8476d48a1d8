// The check every EP test makes against the double reference: the same
// expert ids, and y and every gradient within 1e-5 relative (DESIGN.md §3);
// the check of a lossy token format against its propagated error bound; and
// the check of two runs that must agree bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

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

// A lossy token format (bf16, fp8) against the BoundedValue reference of
// reference_moe_with_lossy_tokens: every element of y and of every gradient
// within its propagated bound plus the float slack 1e-5·max|exact|.
inline void expect_within_bounds(const EpRunResult& run, const BoundedReferenceResult& ref, const std::string& what) {
  auto check = [&](const char* name, const Tensor& got, const std::vector<BoundedValue>& exact) {
    double max_exact = 0;
    for (const auto& v : exact) max_exact = std::max(max_exact, std::abs(v.value));
    for (std::size_t i = 0; i < exact.size(); ++i) {
      const double diff = std::abs(double(got.data<float>()[i]) - exact[i].value);
      ASSERT_LE(diff, exact[i].bound + 1e-5 * max_exact) << what << " " << name << " element " << i;
    }
  };
  check("y", run.y, ref.y);
  check("dx", run.grads.dx, ref.dx);
  check("dgate", run.grads.dgate, ref.dgate);
  check("dwi0", run.grads.dwi0, ref.dwi0);
  check("dwi1", run.grads.dwi1, ref.dwi1);
  check("dwo", run.grads.dwo, ref.dwo);
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
