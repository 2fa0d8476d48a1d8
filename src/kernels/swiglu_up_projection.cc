#include "kernels/swiglu_up_projection.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/threading.h"
#include "kernels/concatenated_weights.h"
#include "kernels/gemm.h"
#include "kernels/group_schedule.h"
#include "kernels/swiglu.h"

namespace epmoe {
namespace {

// Rows split out of the scratch and through the SwiGLU at a time: 32 rows of
// f = 512 are 64 KiB each of h0 and h1, which the SwiGLU then reads from L2.
constexpr std::int64_t kSwigluRows = 32;

void check_pointers(const GroupedGemmShape& shape, std::span<const float* const> groups, const char* name) {
  if (groups.size() != shape.group_sizes.size())
    throw InternalError(std::string("swiglu up projection: ") + std::to_string(groups.size()) + " " + name +
                        " pointers for " + std::to_string(shape.group_sizes.size()) + " groups");
  for (std::size_t g = 0; g < groups.size(); ++g)
    if (groups[g] == nullptr)
      throw InternalError(std::string("swiglu up projection: ") + name + " pointer of group " + std::to_string(g) +
                          " is null");
}

// The group's h0 and h1 from its [rows, 2f] product, and its SwiGLU a few
// rows at a time, each block of h0 and h1 read back while in cache.
void split_and_activate(const float* product, std::int64_t rows, std::int64_t f, float* h0, float* h1, float* act) {
  for (std::int64_t first = 0; first < rows; first += kSwigluRows) {
    const std::int64_t block = std::min(kSwigluRows, rows - first);
    for (std::int64_t r = first; r < first + block; ++r) {
      std::memcpy(h0 + r * f, product + r * 2 * f, sizeof(float) * f);
      std::memcpy(h1 + r * f, product + r * 2 * f + f, sizeof(float) * f);
    }
    if (act != nullptr) swiglu_forward(h0 + first * f, h1 + first * f, act + first * f, block * f);
  }
}

}  // namespace

// Probed on a thread of its own: no modelled clock or trace track to charge.
bool fused_up_projection_keeps_bits(std::int64_t k, std::int64_t f, ComputeDType dtype) {
  static std::mutex mutex;
  static std::map<std::tuple<std::int64_t, std::int64_t, ComputeDType>, bool> answers;
  // OpenBLAS's bits depend on m as well (see the header): a probe at two m cannot vouch for it.
  if (dtype == ComputeDType::f32 && f32_gemm_backend() == F32GemmBackend::openblas) return false;
  const auto key = std::make_tuple(k, f, dtype);
  {
    const std::lock_guard lock(mutex);
    if (auto it = answers.find(key); it != answers.end()) return it->second;
  }
  bool same = true;
  std::thread probe([&] {
    try {
      set_compute_threads(1);
      std::uint64_t state = 0x9e3779b97f4a7c15ull;
      auto next = [&] {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return static_cast<float>(static_cast<std::int32_t>(state >> 32)) * 0x1p-31f;
      };
      std::vector<float> w0(k * f), w1(k * f), w_cat(2 * k * f);
      for (float& v : w0) v = next();
      for (float& v : w1) v = next();
      for (std::int64_t i = 0; i < k; ++i) {
        std::copy_n(w0.data() + i * f, f, w_cat.data() + i * 2 * f);
        std::copy_n(w1.data() + i * f, f, w_cat.data() + i * 2 * f + f);
      }
      for (std::int64_t m : {std::int64_t{5}, std::int64_t{40}}) {
        std::vector<float> x(m * k), h0(m * f), h1(m * f), product(m * 2 * f);
        for (float& v : x) v = next();
        auto run = [&](const float* b, float* c, std::int64_t n) {
          gemm({.a = x.data(),
                .b = b,
                .c = c,
                .m = m,
                .n = n,
                .k = k,
                .compute_dtype = dtype,
                .dynamic_dim = GemmDynamicDim::m,
                .trace_name = "fused product probe"});
        };
        run(w0.data(), h0.data(), f);
        run(w1.data(), h1.data(), f);
        run(w_cat.data(), product.data(), 2 * f);
        for (std::int64_t r = 0; r < m; ++r) {
          same = same && std::memcmp(product.data() + r * 2 * f, h0.data() + r * f, sizeof(float) * f) == 0 &&
                 std::memcmp(product.data() + r * 2 * f + f, h1.data() + r * f, sizeof(float) * f) == 0;
        }
      }
    } catch (...) {
      same = false;  // the unfused path then raises whatever the gemm raised
    }
  });
  probe.join();
  const std::lock_guard lock(mutex);
  answers.emplace(key, same);
  return same;
}

void grouped_swiglu_up_projection(const GroupedGemmShape& shape, const float* x,
                                  std::span<const float* const> wi0_groups, std::span<const float* const> wi1_groups,
                                  float* h0, float* h1, float* act, UpProjection how) {
  check_pointers(shape, wi0_groups, "wi0");
  check_pointers(shape, wi1_groups, "wi1");
  const std::int64_t f = shape.n, k = shape.k;
  if (how == UpProjection::two_products || shape.weight_version == 0 || shape.pack_weights || k == 0 || f == 0 ||
      forward_uses_row_blocks(shape) || !fused_up_projection_keeps_bits(k, f, shape.compute_dtype)) {
    // The forward's own tasks, both products each, the SwiGLU as their epilogue.
    const ForwardProduct products[] = {{wi0_groups, h0}, {wi1_groups, h1}};
    ForwardEpilogue swiglu;
    if (act != nullptr) {
      swiglu = [&](std::int64_t first_row, std::int64_t rows) {
        swiglu_forward(h0 + first_row * f, h1 + first_row * f, act + first_row * f, rows * f);
      };
    }
    grouped_gemm_forward_tasks(shape, x, products, swiglu);
    return;
  }
  // A group that runs on one thread takes the concatenated product: all
  // groups with a budget of one thread, else the schedule's solo groups.
  // Groups the schedule runs on all threads keep the two products of f
  // columns on all threads (their bits, see the header), then their SwiGLU.
  detail::GroupLayout layout = detail::layout_groups(shape);
  const bool one_thread = compute_threads() == 1;
  if (one_thread) {
    layout.solo_groups = layout.team_groups;
    layout.team_groups.clear();
  }
  for (int g : layout.team_groups) {
    const std::int64_t row = layout.offsets[g], rows = shape.group_sizes[g];
    for (auto [w, h] : {std::pair{wi0_groups[g], h0}, std::pair{wi1_groups[g], h1}}) {
      gemm({.a = x + row * k,
            .b = w,
            .c = h + row * f,
            .m = rows,
            .n = f,
            .k = k,
            .compute_dtype = shape.compute_dtype,
            .dynamic_dim = GemmDynamicDim::m,
            .b_version = shape.weight_version,
            .trace_name = "expert group forward"});
    }
    if (act != nullptr) swiglu_forward(h0 + row * f, h1 + row * f, act + row * f, rows * f);
  }
  layout.team_groups.clear();  // done: for_each_group below runs the solo ones only
  std::erase_if(layout.solo_groups, [&](int g) { return shape.group_sizes[g] == 0; });  // nothing to compute
  if (layout.solo_groups.empty()) return;
  // The concatenations, built (or found) on the caller's threads before the
  // groups run side by side.
  std::vector<const float*> solo_wi0, solo_wi1;
  for (int g : layout.solo_groups) {
    solo_wi0.push_back(wi0_groups[g]);
    solo_wi1.push_back(wi1_groups[g]);
  }
  const ConcatenatedWeights concatenated = concatenated_weights(solo_wi0, solo_wi1, k, f, shape.weight_version);
  std::vector<const float*> w_cat(shape.group_sizes.size(), nullptr);
  for (std::size_t i = 0; i < layout.solo_groups.size(); ++i) w_cat[layout.solo_groups[i]] = concatenated.groups[i];
  auto run_group = [&](int g) {
    thread_local std::vector<float> product;  // [rows, 2f], kept between calls
    const std::int64_t row = layout.offsets[g], rows = shape.group_sizes[g];
    if (static_cast<std::int64_t>(product.size()) < rows * 2 * f) product.resize(rows * 2 * f);
    gemm({.a = x + row * k,
          .b = w_cat[g],
          .c = product.data(),
          .m = rows,
          .n = 2 * f,
          .k = k,
          .compute_dtype = shape.compute_dtype,
          .dynamic_dim = GemmDynamicDim::m,
          .b_version = shape.weight_version,
          .trace_name = "expert group forward (wi0|wi1)"});
    split_and_activate(product.data(), rows, f, h0 + row * f, h1 + row * f, act != nullptr ? act + row * f : nullptr);
  };
  if (one_thread) {
    // On the caller's thread, as grouped_gemm_forward runs every group with
    // one thread: its modelled clock and trace track see the work.
    for (int g : layout.solo_groups) run_group(g);
  } else {
    detail::for_each_group(layout, run_group);
  }
}

}  // namespace epmoe
