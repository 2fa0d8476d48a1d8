// Topology: single caller thread (oneDNN on the default OpenMP team), plus a
// test with 4 concurrent caller threads to exercise the per-thread primitive
// cache. Sizes sweep 1, 7, 33, 65 per dimension (odd, across SIMD widths) in
// all four transpose combinations against a double loop.
#include "kernels/gemm.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/buffer_cache.h"
#include "core/error.h"
#include "kernels/convert.h"
#include "reference.h"

namespace epmoe {
namespace {

using testing::kF32RelativeTolerance;
using testing::random_vector;
using testing::reference_gemm;
using testing::relative_error;
using testing::same_bits;

constexpr std::int64_t kSizes[] = {1, 7, 33, 65};

TEST(Gemm, F32MatchesDoubleForAllTransposesAndOddSizes) {
  for (bool transpose_a : {false, true})
    for (bool transpose_b : {false, true})
      for (std::int64_t m : kSizes)
        for (std::int64_t n : kSizes)
          for (std::int64_t k : kSizes) {
            const auto a = random_vector(m * k, 1);
            const auto b = random_vector(k * n, 2);
            std::vector<float> c(m * n, NAN);  // overwritten, never read
            gemm({.a = a.data(),
                  .b = b.data(),
                  .c = c.data(),
                  .m = m,
                  .n = n,
                  .k = k,
                  .transpose_a = transpose_a,
                  .transpose_b = transpose_b});
            const auto ref = reference_gemm(a.data(), b.data(), nullptr, m, n, k, transpose_a, transpose_b);
            ASSERT_LE(relative_error(c, ref.c), kF32RelativeTolerance)
                << "m=" << m << " n=" << n << " k=" << k << " ta=" << transpose_a << " tb=" << transpose_b;
          }
}

TEST(Gemm, AccumulateAddsIntoC) {
  for (bool transpose_a : {false, true})
    for (bool transpose_b : {false, true}) {
      const std::int64_t m = 33, n = 65, k = 7;
      const auto a = random_vector(m * k, 3);
      const auto b = random_vector(k * n, 4);
      const auto c_in = random_vector(m * n, 5);
      auto c = c_in;
      gemm({.a = a.data(),
            .b = b.data(),
            .c = c.data(),
            .m = m,
            .n = n,
            .k = k,
            .transpose_a = transpose_a,
            .transpose_b = transpose_b,
            .accumulate = true});
      const auto ref = reference_gemm(a.data(), b.data(), c_in.data(), m, n, k, transpose_a, transpose_b);
      EXPECT_LE(relative_error(c, ref.c), kF32RelativeTolerance);
    }
}

// One runtime-dimension primitive serves every m (or k): the strides and
// sizes of each call must still be its own.
// bf16 either computes or is refused with a message naming the key (not
// oneDNN's "could not create a primitive descriptor iterator"), and
// bf16_gemm_supported() tells which in advance.
TEST(Gemm, Bf16EitherRunsOrIsRefusedByName) {
  const std::vector<float> a = {1, 2, 3, 4};
  std::vector<float> c(4);
  try {
    gemm({.a = a.data(), .b = a.data(), .c = c.data(), .m = 2, .n = 2, .k = 2, .compute_dtype = ComputeDType::bf16});
    EXPECT_TRUE(bf16_gemm_supported());
    EXPECT_EQ(c, (std::vector<float>{7, 10, 15, 22}));  // small integers: exact in bf16
  } catch (const ConfigError& e) {
    EXPECT_FALSE(bf16_gemm_supported());
    EXPECT_NE(std::string(e.what()).find("compute_dtype=bf16: oneDNN has no bf16 matmul on this CPU for m=2 n=2 k=2"),
              std::string::npos)
        << e.what();
  }
}

TEST(Gemm, DynamicDimensionsMatchDoubleAcrossShapes) {
  for (ComputeDType dtype : {ComputeDType::f32, ComputeDType::bf16})
    if (dtype == ComputeDType::bf16 && !bf16_gemm_supported()) {
      std::cout << "[ NOTE ] bf16 left out: this CPU has no oneDNN bf16 matmul\n";
    } else
      for (bool transpose_a : {false, true})
        for (bool transpose_b : {false, true})
          for (GemmDynamicDim dynamic_dim : {GemmDynamicDim::m, GemmDynamicDim::k})
            for (std::int64_t ragged : {65, 1, 33, 7, 0, 33}) {
              const std::int64_t m = dynamic_dim == GemmDynamicDim::m ? ragged : 19;
              const std::int64_t k = dynamic_dim == GemmDynamicDim::k ? ragged : 23;
              const std::int64_t n = 17;
              const auto a = random_vector(m * k, 30 + ragged);
              const auto b = random_vector(k * n, 40 + ragged);
              const auto c_in = random_vector(m * n, 50);
              auto c = c_in;
              gemm({.a = a.data(),
                    .b = b.data(),
                    .c = c.data(),
                    .m = m,
                    .n = n,
                    .k = k,
                    .transpose_a = transpose_a,
                    .transpose_b = transpose_b,
                    .accumulate = true,
                    .compute_dtype = dtype,
                    .dynamic_dim = dynamic_dim});
              const auto ref = reference_gemm(a.data(), b.data(), c_in.data(), m, n, k, transpose_a, transpose_b);
              ASSERT_LE(relative_error(c, ref.c), dtype == ComputeDType::f32 ? kF32RelativeTolerance : 2e-2)
                  << "m=" << m << " k=" << k << " ta=" << transpose_a << " tb=" << transpose_b;
            }
}

TEST(Gemm, ZeroSizes) {
  const std::vector<float> a(64, 1.0f), b(64, 1.0f);
  std::vector<float> c(16, 7.0f);
  gemm({.a = a.data(), .b = b.data(), .c = c.data(), .m = 0, .n = 4, .k = 4});
  gemm({.a = a.data(), .b = b.data(), .c = c.data(), .m = 4, .n = 0, .k = 4});
  for (float v : c) ASSERT_EQ(v, 7.0f);  // empty output: nothing written
  gemm({.a = a.data(), .b = b.data(), .c = c.data(), .m = 4, .n = 4, .k = 0, .accumulate = true});
  for (float v : c) ASSERT_EQ(v, 7.0f);  // empty sum added: c kept
  gemm({.a = a.data(), .b = b.data(), .c = c.data(), .m = 4, .n = 4, .k = 0});
  for (float v : c) ASSERT_EQ(v, 0.0f);  // empty sum assigned: zero
}

// bf16 error bound. Rounding an operand to bf16 (8 significant bits, RNE)
// gives x(1 + d), |d| <= u = 2^-8. The product of two bf16 values is exact in
// fp32, so each term carries |d_a + d_b + d_a d_b| <= 2u + u^2. Summing k terms
// in fp32 adds at most about k u32 sum|terms| (u32 = 2^-24; a factor 2 covers
// oneDNN's blocked summation order). Hence, per element:
//   |c - c_exact| <= (2u + u^2 + 2 k u32) * sum_p |a_ip| |b_pj|.
TEST(Gemm, Bf16WithinDerivedBoundAndReallyRoundsOperands) {
  if (!bf16_gemm_supported()) GTEST_SKIP() << "this CPU has no oneDNN bf16 matmul";
  constexpr double kU = 0x1p-8, kU32 = 0x1p-24;
  for (bool transpose_a : {false, true})
    for (bool transpose_b : {false, true}) {
      const std::int64_t m = 33, n = 65, k = 129;
      const auto a = random_vector(m * k, 6);
      const auto b = random_vector(k * n, 7);
      std::vector<float> c(m * n);
      gemm({.a = a.data(),
            .b = b.data(),
            .c = c.data(),
            .m = m,
            .n = n,
            .k = k,
            .transpose_a = transpose_a,
            .transpose_b = transpose_b,
            .compute_dtype = ComputeDType::bf16});
      const auto exact = reference_gemm(a.data(), b.data(), nullptr, m, n, k, transpose_a, transpose_b);
      const double bound_factor = 2 * kU + kU * kU + 2 * k * kU32;
      for (std::int64_t i = 0; i < m * n; ++i)
        ASSERT_LE(std::abs(c[i] - exact.c[i]), bound_factor * exact.abs_sum[i]) << i;

      // The result is the fp32 product of the bf16-rounded operands, and visibly
      // not the fp32 product of the originals: bf16 really is what was fed.
      std::vector<float> a_rounded(a.size()), b_rounded(b.size());
      for (std::size_t i = 0; i < a.size(); ++i) a_rounded[i] = bf16_to_float(float_to_bf16(a[i]));
      for (std::size_t i = 0; i < b.size(); ++i) b_rounded[i] = bf16_to_float(float_to_bf16(b[i]));
      const auto rounded =
          reference_gemm(a_rounded.data(), b_rounded.data(), nullptr, m, n, k, transpose_a, transpose_b);
      EXPECT_LE(relative_error(c, rounded.c), kF32RelativeTolerance);
      EXPECT_GT(relative_error(c, exact.c), 10 * kF32RelativeTolerance);
    }
}

TEST(Gemm, ConcurrentCallersGetCorrectResults) {
  constexpr int kCallers = 4;
  std::vector<std::thread> callers;
  std::vector<double> errors(kCallers);
  // bf16 reps only where this CPU has them (else every rep is f32).
  const bool with_bf16 = bf16_gemm_supported();
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([t, with_bf16, &errors] {
      const std::int64_t m = 17 + t, n = 33, k = 65;  // distinct and shared shapes
      const auto a = random_vector(m * k, 10 + t);
      const auto b = random_vector(k * n, 20 + t);
      std::vector<float> c(m * n);
      double worst = 0.0;
      for (int rep = 0; rep < 20; ++rep) {
        gemm({.a = a.data(),
              .b = b.data(),
              .c = c.data(),
              .m = m,
              .n = n,
              .k = k,
              .compute_dtype = rep % 2 && with_bf16 ? ComputeDType::bf16 : ComputeDType::f32});
        const auto ref = reference_gemm(a.data(), b.data(), nullptr, m, n, k, false, false);
        worst = std::max(worst, relative_error(c, ref.c));
      }
      errors[t] = worst;
    });
  }
  for (auto& caller : callers) caller.join();
  for (double error : errors) EXPECT_LE(error, 1e-2);  // bf16 runs included
}

// A weight version (b_version) only lets gemm keep what it derives from b:
// without pack_b the results are the unversioned call's bits (f32: nothing
// kept; bf16: the same conversion, kept), for every transpose and a ragged m.
TEST(Gemm, WeightVersionKeepsTheBits) {
  for (ComputeDType dtype : {ComputeDType::f32, ComputeDType::bf16}) {
    if (dtype == ComputeDType::bf16 && !bf16_gemm_supported()) continue;
    for (bool transpose_b : {false, true})
      for (std::int64_t m : {37, 1, 64}) {
        const std::int64_t k = 45, n = 29;
        const auto a = random_vector(m * k, 60 + m), b = random_vector(k * n, 61);
        std::vector<float> plain(m * n), versioned(m * n);
        const GemmArgs args{.a = a.data(),
                            .b = b.data(),
                            .c = plain.data(),
                            .m = m,
                            .n = n,
                            .k = k,
                            .transpose_b = transpose_b,
                            .compute_dtype = dtype,
                            .dynamic_dim = GemmDynamicDim::m};
        gemm(args);
        GemmArgs with_version = args;
        with_version.c = versioned.data();
        with_version.b_version = 5;
        gemm(with_version);
        gemm(with_version);  // the second call from what the first kept
        ASSERT_EQ(std::memcmp(plain.data(), versioned.data(), plain.size() * sizeof(float)), 0)
            << to_string(dtype) << " m=" << m << " tb=" << transpose_b;
      }
  }
}

// f32, b not transposed, with a weight version: from m = 32 rows and n = 256
// columns gemm runs on b's copy 16 bytes off the 32-byte grid
// (kernels/gemm.cc, uses_off_grid_b; oneDNN's gemm:jit is faster there on
// AVX2). Held here, at the rule's edges (m = 0, 1, 31, 32, 33, 300; n = 255,
// 256, 257; odd k): b on a 64-byte boundary gives the unversioned call's
// bits at every m (the copy holds the same values), within the f32 bound of
// the double reference; the copy is made once per version (preparations,
// bytes) and only from 32 rows and 256 columns (n = 29 and 255: none); a
// new version of the same buffer, values changed in
// place, is copied again and used; its block comes from the buffer cache
// (the old version's, no fresh memory: new pages cost ~11 us each here).
TEST(Gemm, OffGridWeightsKeepTheBitsAndFollowTheVersion) {
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  const bool onednn = f32_gemm_backend() == F32GemmBackend::onednn;  // OpenBLAS keeps nothing
  for (const auto& [k, n] :
       {std::pair<std::int64_t, std::int64_t>{45, 29}, {33, 255}, {33, 256}, {45, 257}, {128, 256}, {1024, 512}}) {
    const std::unique_ptr<float, Free> b_storage(
        static_cast<float*>(std::aligned_alloc(64, ((k * n * sizeof(float) + 63) / 64) * 64)));
    float* b = b_storage.get();
    for (std::int64_t m : {0, 1, 31, 32, 33, 300}) {
      const auto a = random_vector(m * k, 80 + m);
      const auto first_values = random_vector(k * n, 81), second_values = random_vector(k * n, 82);
      std::copy(first_values.begin(), first_values.end(), b);
      clear_gemm_weight_cache();
      std::vector<float> plain(m * n), versioned(m * n);
      GemmArgs args{.a = a.data(), .b = b, .c = plain.data(), .m = m, .n = n, .k = k};
      gemm(args);
      GemmArgs with_version = args;
      with_version.c = versioned.data();
      with_version.b_version = 1;
      const GemmWeightCacheStats before = gemm_weight_cache_stats();
      gemm(with_version);
      gemm(with_version);  // the second call from the copy the first made
      const std::string where = "k=" + std::to_string(k) + " n=" + std::to_string(n) + " m=" + std::to_string(m);
      ASSERT_TRUE(same_bits(plain, versioned)) << where;
      if (m * n * k <= (1 << 22)) {  // the double loop; at the larger shapes the bits above vouch
        EXPECT_LE(relative_error(versioned, reference_gemm(a.data(), b, nullptr, m, n, k, false, false).c),
                  kF32RelativeTolerance)
            << where;
      }
      const bool copied = onednn && m >= 32 && n >= 256;
      const GemmWeightCacheStats after = gemm_weight_cache_stats();
      EXPECT_EQ(after.preparations - before.preparations, copied ? 1 : 0) << where;
      EXPECT_EQ(after.bytes, copied ? k * n * static_cast<std::int64_t>(sizeof(float)) : 0) << where;

      std::copy(second_values.begin(), second_values.end(), b);  // same buffer, new values
      const std::int64_t fresh_blocks = buffer_cache_stats().misses;
      with_version.b_version = 2;
      gemm(with_version);
      gemm(args);
      ASSERT_TRUE(same_bits(plain, versioned)) << where << ": the old version's copy was used";
      EXPECT_EQ(gemm_weight_cache_stats().preparations - after.preparations, copied ? 1 : 0) << where;
      EXPECT_EQ(buffer_cache_stats().misses, fresh_blocks) << where << ": the new version's copy took fresh memory";
    }
  }
  clear_gemm_weight_cache();
  EXPECT_EQ(gemm_weight_cache_stats().bytes, 0);
}

// The cache's byte counter is what it holds: two callers replacing each
// other's version of one b (each replacement subtracts the old entry's
// bytes) and a third clearing the cache now and then, while a caller that
// still holds a replaced or cleared entry makes its copy. Such a late copy
// must not count: the counter would then drift above what the entries hold
// (before the fix it did, by one copy per such race: 1-2 KiB per thousand
// calls here).
TEST(Gemm, WeightCacheBytesStayWhatTheEntriesHold) {
  if (f32_gemm_backend() != F32GemmBackend::onednn) GTEST_SKIP() << "OpenBLAS keeps nothing";
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  constexpr std::int64_t m = 32, n = 256, k = 1;  // the smallest product that is copied off the grid
  const std::unique_ptr<float, Free> b(static_cast<float*>(std::aligned_alloc(64, k * n * sizeof(float))));
  const auto values = random_vector(k * n, 90);
  std::copy(values.begin(), values.end(), b.get());
  const auto a = random_vector(m * k, 91);
  const float* held[] = {b.get()};
  for (const bool with_clears : {false, true}) {
    clear_gemm_weight_cache();
    constexpr std::uint64_t kCalls = 20000;
    std::atomic<std::uint64_t> calls{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t)
      threads.emplace_back([&, t] {
        std::vector<float> c(m * n);
        for (std::uint64_t i = 0; i < kCalls; ++i) {
          gemm({.a = a.data(), .b = b.get(), .c = c.data(), .m = m, .n = n, .k = k, .b_version = 2 * i + t + 1});
          ++calls;
        }
      });
    // Clears during the first three quarters of the calls only: a clear
    // resets the counter, so one after the last call would hide a drift.
    if (with_clears)
      threads.emplace_back([&] {
        while (calls < 3 * kCalls / 2) clear_gemm_weight_cache();
      });
    for (auto& thread : threads) thread.join();
    EXPECT_EQ(gemm_weight_cache_stats().bytes, gemm_weight_cache_bytes(held)) << "with clears: " << with_clears;
  }
  clear_gemm_weight_cache();
}

// pack_b: within the f32 (or bf16) bound of the double reference; a new
// version of the same buffer (values changed in place) is used, not the
// matrix kept for the old version; the cache counts what it kept.
TEST(Gemm, PackedWeightsFollowTheVersion) {
  for (ComputeDType dtype : {ComputeDType::f32, ComputeDType::bf16}) {
    if (dtype == ComputeDType::bf16 && !bf16_gemm_supported()) continue;
    const double tol = dtype == ComputeDType::f32 ? kF32RelativeTolerance : 2e-2;
    for (bool transpose_b : {false, true}) {
      const std::int64_t m = 33, k = 64, n = 48;
      const auto a = random_vector(m * k, 70);
      auto b = random_vector(k * n, 71);
      std::vector<float> c(m * n);
      GemmArgs args{.a = a.data(),
                    .b = b.data(),
                    .c = c.data(),
                    .m = m,
                    .n = n,
                    .k = k,
                    .transpose_b = transpose_b,
                    .compute_dtype = dtype,
                    .b_version = 1,
                    .pack_b = true};
      gemm(args);
      EXPECT_LE(relative_error(c, reference_gemm(a.data(), b.data(), nullptr, m, n, k, false, transpose_b).c), tol);
      const auto new_values = random_vector(k * n, 72);
      std::copy(new_values.begin(), new_values.end(), b.begin());  // same buffer, new values
      args.b_version = 2;
      gemm(args);
      EXPECT_LE(relative_error(c, reference_gemm(a.data(), b.data(), nullptr, m, n, k, false, transpose_b).c), tol)
          << to_string(dtype) << " tb=" << transpose_b << ": the old version's matrix was used";
    }
  }
  const GemmWeightCacheStats stats = gemm_weight_cache_stats();
  // pack_b asks for an entry even where nothing needs packing (oneDNN's path).
  if (f32_gemm_backend() == F32GemmBackend::onednn) {
    EXPECT_GE(stats.entries, 1);
  }
  clear_gemm_weight_cache();
  EXPECT_EQ(gemm_weight_cache_stats().entries, 0);
  EXPECT_EQ(gemm_weight_cache_stats().bytes, 0);
}

// The census counts every product that ran, once, with its 2mnk FLOPs,
// under the implementation that ran it: across the paths of gemm() (plain,
// accumulate, runtime m, b transposed, packed and off-grid weights with a
// version), from two threads at once, and not the empty products.
TEST(Gemm, ImplementationCensusCountsEveryProductOnce) {
  reset_gemm_implementation_census();
  EXPECT_TRUE(gemm_implementation_census().empty());
  const auto a = random_vector(300 * 64, 80), b = random_vector(64 * 512, 81);
  std::vector<float> c(300 * 512);
  std::int64_t calls = 0, flops = 0;
  const auto run = [&](GemmArgs args) {
    args.a = a.data();
    args.b = b.data();
    args.c = c.data();
    gemm(args);
    if (args.m > 0 && args.n > 0 && args.k > 0) {
      ++calls;
      flops += 2 * args.m * args.n * args.k;
    }
  };
  run({.m = 5, .n = 7, .k = 3});
  run({.m = 5, .n = 7, .k = 3, .accumulate = true});
  run({.m = 17, .n = 9, .k = 11, .dynamic_dim = GemmDynamicDim::m});
  run({.m = 17, .n = 9, .k = 11, .transpose_b = true});
  run({.m = 33, .n = 48, .k = 64, .b_version = 1, .pack_b = true});
  run({.m = 64, .n = 256, .k = 32, .b_version = 3});  // off the grid (uses_off_grid_b)
  run({.m = 0, .n = 7, .k = 3});
  run({.m = 5, .n = 7, .k = 0});
  std::vector<float> c2(c.size());
  std::thread other([&] { gemm({.a = a.data(), .b = b.data(), .c = c2.data(), .m = 40, .n = 30, .k = 20}); });
  other.join();
  ++calls;
  flops += 2 * 40 * 30 * 20;
  if (bf16_gemm_supported()) run({.m = 9, .n = 10, .k = 12, .compute_dtype = ComputeDType::bf16});

  std::int64_t counted_calls = 0, counted_flops = 0;
  for (const GemmImplementationUse& use : gemm_implementation_census()) {
    counted_calls += use.calls;
    counted_flops += use.flops;
    // oneDNN's names are "<kind>:<isa>" ("gemm:jit", "brg:avx512_core_amx").
    if (use.compute_dtype == ComputeDType::f32 && f32_gemm_backend() == F32GemmBackend::openblas) {
      EXPECT_EQ(use.implementation, "openblas");
    } else {
      EXPECT_NE(use.implementation.find(':'), std::string::npos) << use.implementation;
    }
  }
  EXPECT_EQ(counted_calls, calls);
  EXPECT_EQ(counted_flops, flops);
  clear_gemm_weight_cache();
  reset_gemm_implementation_census();
  EXPECT_TRUE(gemm_implementation_census().empty());
}

// The grouped dlhs (f32, b transposed, a new m every step) creates no
// primitive per new m where the runtime-m primitive is the implementation the
// exact shape would get (gemm:jit on AVX2: it took 10% of the main job's
// experts backward to create them), and one per new m where the exact shape
// reaches another kernel (brgemm on AVX-512); the results hold either way.
TEST(Gemm, ANewRowCountCreatesAPrimitiveOnlyWhereTheExactShapeGetsAnotherKernel) {
  const std::int64_t n = 24, k = 40;
  const bool keeps = gemm_runtime_m_keeps_the_kernel(n, k, /*transpose_b=*/true, ComputeDType::f32);
  const auto a = random_vector(97 * n, 90), b = random_vector(k * n, 91);
  std::vector<float> c(97 * k);
  const auto run = [&](std::int64_t m) {
    gemm({.a = a.data(),
          .b = b.data(),
          .c = c.data(),
          .m = m,
          .n = k,
          .k = n,
          .transpose_b = true,
          .dynamic_dim = GemmDynamicDim::m});
    c.resize(m * k);
    EXPECT_LE(relative_error(c, reference_gemm(a.data(), b.data(), nullptr, m, k, n, false, true).c),
              kF32RelativeTolerance)
        << "m=" << m;
    c.resize(97 * k);
  };
  run(37);  // the first m: the runtime-m primitive, or the exact shape 37
  reset_gemm_implementation_census();
  for (std::int64_t m : {41, 53, 97}) run(m);
  std::int64_t created = 0;
  for (const GemmImplementationUse& use : gemm_implementation_census()) created += use.primitives;
  const bool onednn = f32_gemm_backend() == F32GemmBackend::onednn;
  EXPECT_EQ(created, onednn && !keeps ? 3 : 0)
      << (keeps ? "runtime m keeps the kernel" : "the exact shape's kernel differs");
  reset_gemm_implementation_census();
}

// The library follows EPMOE_F32_GEMM (ctest also runs these suites with
// EPMOE_F32_GEMM=openblas where the build has it).
TEST(Gemm, F32BackendFollowsTheEnvironment) {
  const char* value = std::getenv("EPMOE_F32_GEMM");
  const std::string name = value != nullptr ? value : "";
  EXPECT_EQ(f32_gemm_backend(), name == "openblas" ? F32GemmBackend::openblas : F32GemmBackend::onednn);
}

TEST(ComputeDType, ParsesAndNamesTheKey) {
  EXPECT_EQ(parse_compute_dtype("compute_dtype", "f32"), ComputeDType::f32);
  EXPECT_EQ(parse_compute_dtype("compute_dtype", "bf16"), ComputeDType::bf16);
  EXPECT_EQ(to_string(ComputeDType::bf16), "bf16");
  try {
    parse_compute_dtype("compute_dtype", "fp16");
    FAIL() << "fp16 accepted";
  } catch (const ConfigError& error) {
    EXPECT_STREQ(error.what(), "compute_dtype=fp16: must be one of f32, bf16");
  }
}

}  // namespace
}  // namespace epmoe
