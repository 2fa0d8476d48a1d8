#include "kernels/gemm.h"

#include <oneapi/dnnl/dnnl.hpp>
#if defined(EPMOE_HAVE_OPENBLAS)
#include <cblas.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <epmoe/dtype.h>

#include "core/modelled_clock.h"

#include "core/buffer_cache.h"
#include "core/error.h"
#include "core/threading.h"
#include "kernels/convert.h"
#include "kernels/few_rows_gemm.h"

namespace epmoe {
namespace {

using dnnl::memory;

struct PrimitiveKey {
  std::int64_t m, n, k;
  bool transpose_a, transpose_b, accumulate;
  ComputeDType compute_dtype;
  int num_threads;      // oneDNN partitions the work at creation for this many threads
  bool pack_b = false;  // weights desc `any`: oneDNN picks b's layout
  bool operator==(const PrimitiveKey&) const = default;
};

struct PrimitiveKeyHash {
  std::size_t operator()(const PrimitiveKey& key) const {
    std::size_t h = std::hash<std::int64_t>{}(key.m);
    h = h * 0x9e3779b97f4a7c15ull + std::hash<std::int64_t>{}(key.n);
    h = h * 0x9e3779b97f4a7c15ull + std::hash<std::int64_t>{}(key.k);
    h = h * 31 + (key.transpose_a ? 1 : 0) + (key.transpose_b ? 2 : 0) + (key.accumulate ? 4 : 0) +
        (key.compute_dtype == ComputeDType::bf16 ? 8 : 0) + (key.pack_b ? 16 : 0) + 32 * key.num_threads;
    return h;
  }
};

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);  // shared; engines are thread-safe
  return engine;
}

memory::data_type operand_type(ComputeDType dtype) {
  return dtype == ComputeDType::bf16 ? memory::data_type::bf16 : memory::data_type::f32;
}

// Row-major [rows, cols] matrix, or the transpose of a row-major [cols, rows]
// one: a transpose is only a stride swap, never a copy.
memory::desc matrix_desc(std::int64_t rows, std::int64_t cols, bool transposed, memory::data_type type) {
  const memory::dims strides = transposed ? memory::dims{1, rows} : memory::dims{cols, 1};
  return memory::desc({rows, cols}, type, strides);
}

struct GemmMemoryDescs {
  memory::desc a, b, c;
};

GemmMemoryDescs make_descs(const PrimitiveKey& key) {
  return {matrix_desc(key.m, key.k, key.transpose_a, operand_type(key.compute_dtype)),
          matrix_desc(key.k, key.n, key.transpose_b, operand_type(key.compute_dtype)),
          matrix_desc(key.m, key.n, false, memory::data_type::f32)};
}

// --- Which implementation ran the products (gemm_implementation_census) ---
// One counter per (implementation, dtype), made when a primitive of it is
// first created and never freed (a deque: stable addresses), so a cached
// primitive holds its counter and a call counts with two relaxed atomic adds,
// no lock.
struct ImplementationCounter {
  ImplementationCounter(std::string name, ComputeDType dtype) : implementation(std::move(name)), compute_dtype(dtype) {}
  const std::string implementation;
  const ComputeDType compute_dtype;
  std::atomic<std::int64_t> calls{0}, flops{0}, primitives{0};

  void count(const GemmArgs& args) {
    calls.fetch_add(1, std::memory_order_relaxed);
    flops.fetch_add(2 * args.m * args.n * args.k, std::memory_order_relaxed);
  }
};

struct ImplementationCensus {
  std::mutex mutex;
  std::deque<ImplementationCounter> counters;
};

ImplementationCensus& implementation_census() {
  static ImplementationCensus census;
  return census;
}

ImplementationCounter& implementation_counter(const std::string& implementation, ComputeDType dtype) {
  ImplementationCensus& census = implementation_census();
  const std::lock_guard lock(census.mutex);
  for (ImplementationCounter& counter : census.counters) {
    if (counter.implementation == implementation && counter.compute_dtype == dtype) return counter;
  }
  return census.counters.emplace_back(implementation, dtype);
}

// A primitive, the weights layout it was created for (b's plain desc, or
// with pack_b the layout oneDNN chose) and the counter of the implementation
// oneDNN picked for it.
struct CachedPrimitive {
  dnnl::matmul primitive;
  memory::desc weights;
  ImplementationCounter* counter;
};

CachedPrimitive make_primitive(const PrimitiveKey& key) {
  GemmMemoryDescs descs = make_descs(key);
  if (key.pack_b) descs.b = memory::desc({key.k, key.n}, operand_type(key.compute_dtype), memory::format_tag::any);
  dnnl::primitive_attr attr;
  if (key.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::desc desc(descs.a, descs.b, descs.c);
  try {
    const dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
    ImplementationCounter& counter = implementation_counter(pd.impl_info_str(), key.compute_dtype);
    counter.primitives.fetch_add(1, std::memory_order_relaxed);
    return {dnnl::matmul(pd), pd.weights_desc(), &counter};
  } catch (const dnnl::error& e) {
    // oneDNN's own text ("could not create a primitive descriptor
    // iterator") names neither the key nor the cause.
    auto dim = [](std::int64_t v) { return v == DNNL_RUNTIME_DIM_VAL ? std::string("runtime") : std::to_string(v); };
    if (key.compute_dtype == ComputeDType::bf16)
      throw ConfigError("compute_dtype=bf16: oneDNN has no bf16 matmul on this CPU for m=" + dim(key.m) + " n=" +
                        dim(key.n) + " k=" + dim(key.k) + " (its bf16 kernels need AVX-512); use compute_dtype=f32");
    throw;
  }
}

// Everything a calling thread needs, owned by that thread: rank threads and
// OpenMP workers call gemm concurrently and never share a stream, a cache
// entry or a scratch buffer, so there is no lock on the hot path.
struct ThreadGemmState {
  dnnl::stream stream{cpu_engine()};
  std::unordered_map<PrimitiveKey, CachedPrimitive, PrimitiveKeyHash> primitives;
  // pack_b shapes whose primitive chose a plain b layout (probed once per
  // shape without m, so a new m every step costs no primitive creation).
  std::unordered_map<PrimitiveKey, bool, PrimitiveKeyHash> plain_b_layout;
  // f32 shapes with b transposed (m = 0) whose runtime-m primitive runs the
  // exact shape's kernel (runtime_m_keeps_the_kernel).
  std::unordered_map<PrimitiveKey, bool, PrimitiveKeyHash> runtime_m_same_kernel;
  std::vector<bf16_t> a_bf16, b_bf16;  // reusable bf16 operand copies
};

// Exact shapes that change every step (f32 dlhs, callers' own ragged shapes)
// make the cache grow; it is dropped wholesale beyond this many entries.
constexpr std::size_t kMaxCachedPrimitives = 4096;

ThreadGemmState& thread_state() {
  thread_local ThreadGemmState state;
  return state;
}

const CachedPrimitive& cached_primitive(ThreadGemmState& state, const PrimitiveKey& key) {
  auto it = state.primitives.find(key);
  if (it != state.primitives.end()) return it->second;
  if (state.primitives.size() >= kMaxCachedPrimitives) state.primitives.clear();
  return state.primitives.emplace(key, make_primitive(key)).first->second;
}

// Whether a primitive with m given at run time runs on the same oneDNN
// implementation as the exact shape would, for this product's n, k,
// transposes and threads: probed once per thread and shape (m = 64 standing
// for every m), by the names oneDNN gives the two primitives.
bool runtime_m_keeps_the_kernel(ThreadGemmState& state, const PrimitiveKey& exact_key) {
  PrimitiveKey shape_key = exact_key;
  shape_key.m = 0;
  if (auto it = state.runtime_m_same_kernel.find(shape_key); it != state.runtime_m_same_kernel.end()) return it->second;
  PrimitiveKey probe = exact_key, runtime = exact_key;
  probe.m = 64;
  runtime.m = DNNL_RUNTIME_DIM_VAL;
  const ImplementationCounter* exact_kernel = cached_primitive(state, probe).counter;
  const bool same = exact_kernel == cached_primitive(state, runtime).counter;
  state.runtime_m_same_kernel.emplace(shape_key, same);
  return same;
}

const bf16_t* to_bf16(const float* src, std::int64_t count, std::vector<bf16_t>& scratch) {
  if (scratch.size() < static_cast<std::size_t>(count)) scratch.resize(count);
  convert(std::span<const float>(src, count), std::span<bf16_t>(scratch.data(), count));
  return scratch.data();
}

// --- Prepared b operands per weight version -------------------------------
// Shared by all threads (a weight matrix is used by whichever OpenMP worker
// runs its group, and by forward and backward), unlike the primitives: a
// lookup takes the cache's mutex once per call (~50 ns next to a GEMM of
// milliseconds); an entry's preparation takes only that entry's mutex, so
// threads preparing different matrices do not wait for each other.

// b as stored: [k, n], or [n, k] when transposed; so that W used as W in the
// forward and as W^T in dlhs shares one entry (one bf16 copy).
struct WeightKey {
  const void* b;
  std::int64_t rows, cols;
  ComputeDType compute_dtype;
  bool operator==(const WeightKey&) const = default;
};

struct WeightKeyHash {
  std::size_t operator()(const WeightKey& key) const {
    std::size_t h = std::hash<const void*>{}(key.b);
    h = h * 0x9e3779b97f4a7c15ull + std::hash<std::int64_t>{}(key.rows);
    h = h * 0x9e3779b97f4a7c15ull + std::hash<std::int64_t>{}(key.cols);
    return h * 2 + (key.compute_dtype == ComputeDType::bf16 ? 1 : 0);
  }
};

struct PackedB {
  bool transpose_b;  // which logical matrix (W or W^T) is packed
  memory::desc desc;
  memory mem;  // owns its buffer
};

// b's f32 values, placed kOffGridBytes past a 64-byte boundary (see
// uses_off_grid_b). The block comes from the buffer cache and goes back to
// it, so that the next version's copy, made on the same thread, finds pages
// already in memory (a new page costs ~11 us here, core/buffer_cache.h).
class OffGridCopy {
 public:
  OffGridCopy(const float* b, std::int64_t count)
      : block_(acquire_buffer(static_cast<std::size_t>(count) * sizeof(float) + kOffGridBytes)),
        data_(reinterpret_cast<float*>(static_cast<char*>(block_.data) + kOffGridBytes)),
        count_(count) {
    std::memcpy(data_, b, static_cast<std::size_t>(count) * sizeof(float));
  }
  ~OffGridCopy() { release_buffer(block_.data, block_.capacity_bytes); }
  OffGridCopy(const OffGridCopy&) = delete;
  OffGridCopy& operator=(const OffGridCopy&) = delete;
  const float* data() const { return data_; }
  std::int64_t bytes() const { return count_ * static_cast<std::int64_t>(sizeof(float)); }

 private:
  // Blocks are 64-byte aligned: 16 bytes past that is off the 32-byte grid
  // (any offset that is not a multiple of 32 measured the same, 4-48 bytes).
  static constexpr std::size_t kOffGridBytes = 16;
  BufferBlock block_;
  float* data_;
  std::int64_t count_;
};

struct WeightEntry {
  std::uint64_t version = 0;
  std::mutex mutex;                              // guards the fields below
  std::vector<bf16_t> bf16;                      // empty until converted
  std::vector<std::unique_ptr<PackedB>> packed;  // append-only: pointers stay valid
  std::unique_ptr<OffGridCopy> off_grid;         // null until copied
  // Whether the cache's byte counter includes this entry: false once it is
  // replaced or cleared. A call that still holds it may prepare a form after
  // that; those bytes are freed with the entry and never counted (counting
  // them drifted the counter up by one form per such race).
  bool counted = true;
};

// What an entry holds, in bytes; its mutex held by the caller.
std::int64_t held_bytes(const WeightEntry& entry) {
  std::int64_t bytes = static_cast<std::int64_t>(entry.bf16.size() * sizeof(bf16_t));
  for (const auto& p : entry.packed) bytes += static_cast<std::int64_t>(p->desc.get_size());
  if (entry.off_grid) bytes += entry.off_grid->bytes();
  return bytes;
}

struct WeightCache {
  std::mutex mutex;
  std::unordered_map<WeightKey, std::shared_ptr<WeightEntry>, WeightKeyHash> entries;
  std::atomic<std::int64_t> bytes{0}, preparations{0}, reuses{0};
};

WeightCache& weight_cache() {
  static WeightCache cache;
  return cache;
}

// A form of `entry` was prepared (its mutex held by the caller).
void count_prepared(const WeightEntry& entry, std::int64_t bytes) {
  if (entry.counted) weight_cache().bytes += bytes;
  ++weight_cache().preparations;
}

// `entry` leaves the cache (its mutex held by the caller).
void uncount(WeightEntry& entry) {
  if (entry.counted) weight_cache().bytes -= held_bytes(entry);
  entry.counted = false;
}

// Drops every entry; cache.mutex held by the caller. Each entry is marked
// under its own lock and unlocked before the map lets it go.
void drop_all(WeightCache& cache) {
  for (const auto& [key, entry] : cache.entries) {
    const std::lock_guard entry_lock(entry->mutex);
    uncount(*entry);
  }
  cache.entries.clear();
}

// The entry for b at this version; a different version replaces the entry
// (holders of the old one keep it alive until their call ends).
std::shared_ptr<WeightEntry> weight_entry(const GemmArgs& args) {
  const WeightKey key{args.b, args.transpose_b ? args.n : args.k, args.transpose_b ? args.k : args.n,
                      args.compute_dtype};
  WeightCache& cache = weight_cache();
  const std::lock_guard lock(cache.mutex);
  auto it = cache.entries.find(key);
  if (it != cache.entries.end() && it->second->version == args.b_version) return it->second;
  if (it == cache.entries.end() && cache.entries.size() >= static_cast<std::size_t>(kMaxGemmWeightEntries))
    drop_all(cache);
  auto entry = std::make_shared<WeightEntry>();
  entry->version = args.b_version;
  if (it != cache.entries.end()) {
    // The old entry is swapped out first and unlocked before `old` lets it
    // go: replacing it under its own lock freed a locked mutex when no call
    // held it any more (ThreadSanitizer: unlock of an unlocked mutex).
    const std::shared_ptr<WeightEntry> old = std::exchange(it->second, entry);
    const std::lock_guard old_lock(old->mutex);
    uncount(*old);
  } else {
    cache.entries.emplace(key, entry);
  }
  return entry;
}

// b's bf16 copy, converted on first use of this version.
const bf16_t* prepared_bf16(WeightEntry& entry, const GemmArgs& args) {
  const std::lock_guard lock(entry.mutex);
  const std::int64_t count = args.k * args.n;
  if (entry.bf16.empty()) {
    entry.bf16.resize(count);
    convert(std::span<const float>(args.b, count), std::span<bf16_t>(entry.bf16.data(), count));
    count_prepared(entry, count * static_cast<std::int64_t>(sizeof(bf16_t)));
  } else {
    ++weight_cache().reuses;
  }
  return entry.bf16.data();
}

// b (f32, or its bf16 copy `source`) reordered into `layout`, once per version.
const memory& prepared_packed(WeightEntry& entry, const GemmArgs& args, const memory::desc& source_desc,
                              const void* source, const memory::desc& layout, dnnl::stream& stream) {
  const std::lock_guard lock(entry.mutex);
  for (const auto& p : entry.packed) {
    if (p->transpose_b == args.transpose_b && p->desc == layout) {
      ++weight_cache().reuses;
      return p->mem;
    }
  }
  auto packed = std::make_unique<PackedB>(PackedB{args.transpose_b, layout, memory(layout, cpu_engine())});
  memory source_mem(source_desc, cpu_engine(), const_cast<void*>(source));
  dnnl::reorder(source_mem, packed->mem).execute(stream, source_mem, packed->mem);
  entry.packed.push_back(std::move(packed));
  count_prepared(entry, static_cast<std::int64_t>(layout.get_size()));
  return entry.packed.back()->mem;
}

// b's copy off the 32-byte grid, made on first use of this version.
const float* prepared_off_grid(WeightEntry& entry, const GemmArgs& args) {
  const std::lock_guard lock(entry.mutex);
  if (!entry.off_grid) {
    entry.off_grid = std::make_unique<OffGridCopy>(args.b, args.k * args.n);
    count_prepared(entry, entry.off_grid->bytes());
  } else {
    ++weight_cache().reuses;
  }
  return entry.off_grid->data();
}

// Whether this f32 product runs on b's copy off the 32-byte grid. oneDNN
// 2.6's gemm:jit on AVX2 (AMD EPYC, Zen 3) runs c = a b, b not transposed,
// at other speeds depending on where b starts, with the same bits. One
// thread, min of 15 interleaved repetitions, two runs at load 4-8
// (bench/expert_product.cc, docs/BENCHMARKS.md issue 29, 2026-12-07), with
// b on a 32-byte boundary (every expert matrix of a weight tensor is: Tensor
// buffers are 64-byte aligned and a matrix is a multiple of 32 bytes) vs 16
// bytes off it, fraction of the FMA peak:
//   H=1024 F=512, 32 <= M <= 512: 0.47-0.63 vs 0.63-0.87 (equal from 768)
//   H=512 F=1024, 32 <= M <= 256: 0.39-0.47 vs 0.55-0.83 (equal from 384)
//   H=128 F=256,  32 <= M:        0.77-0.90 vs 0.80-0.92 (+0-5%)
//   H=256 F=128,  32 <= M:        0.80-0.94 vs 0.79-0.93 (-4% to +1%)
//   M = 16: the grid faster at every shape (0.44 vs 0.28 at H=512 F=1024)
// So: f32, b not transposed and on the grid, with a weight version to keep
// the copy per version, m >= kOffGridMinRows and n >= kOffGridMinColumns.
// The transposed b (dlhs) and a transposed a (drhs) measured no such
// difference.
constexpr std::int64_t kOffGridMinRows = 32;
constexpr std::int64_t kOffGridMinColumns = 256;
bool uses_off_grid_b(const GemmArgs& args) {
  return args.compute_dtype == ComputeDType::f32 && args.b_version != 0 && !args.transpose_b &&
         args.m >= kOffGridMinRows && args.n >= kOffGridMinColumns &&
         reinterpret_cast<std::uintptr_t>(args.b) % 32 == 0;
}

// Whether this product runs on few_rows_gemm rather than oneDNN: f32, a and
// b as stored, at most kFewRows rows, with or without pack_b (so that a row
// block's last few rows keep the per-group path's bits where b's layout is
// plain). Measured against oneDNN 2.6's gemm:jit on AVX2
// (kernels/few_rows_gemm.h); not measured against brgemm (AVX-512, AMX):
// bench_few_rows is what to run there.
bool uses_few_rows_kernel(const GemmArgs& args) {
  return args.compute_dtype == ComputeDType::f32 && !args.transpose_a && !args.transpose_b && args.m <= kFewRows;
}

bool is_plain(const memory::desc& desc) {
  return desc.data.format_kind == dnnl_blocked && desc.data.format_desc.blocking.inner_nblks == 0;
}

}  // namespace

F32GemmBackend f32_gemm_backend() {
  static const F32GemmBackend backend = [] {
    const char* value = std::getenv("EPMOE_F32_GEMM");
    const std::string name = value != nullptr ? value : "";
    if (name.empty() || name == "onednn") return F32GemmBackend::onednn;
    if (name == "openblas") {
#if defined(EPMOE_HAVE_OPENBLAS)
      return F32GemmBackend::openblas;
#else
      throw ConfigError(
          "EPMOE_F32_GEMM=openblas: this build has no OpenBLAS (install libopenblas0-openmp "
          "and libopenblas-dev, then reconfigure)");
#endif
    }
    throw ConfigError("EPMOE_F32_GEMM=" + name + ": must be one of onednn, openblas");
  }();
  return backend;
}

GemmWeightCacheStats gemm_weight_cache_stats() {
  WeightCache& cache = weight_cache();
  const std::lock_guard lock(cache.mutex);
  return {static_cast<std::int64_t>(cache.entries.size()), cache.bytes.load(), cache.preparations.load(),
          cache.reuses.load()};
}

std::int64_t gemm_weight_cache_bytes(std::span<const float* const> matrices) {
  const std::unordered_set<const void*> wanted(matrices.begin(), matrices.end());
  WeightCache& cache = weight_cache();
  const std::lock_guard lock(cache.mutex);
  std::int64_t bytes = 0;
  for (const auto& [key, entry] : cache.entries) {
    if (!wanted.contains(key.b)) continue;
    const std::lock_guard entry_lock(entry->mutex);
    bytes += held_bytes(*entry);
  }
  return bytes;
}

void clear_gemm_weight_cache() {
  WeightCache& cache = weight_cache();
  const std::lock_guard lock(cache.mutex);
  drop_all(cache);
}

void gemm(const GemmArgs& args) {
  if (args.m == 0 || args.n == 0) return;
  if (args.k == 0) {
    if (!args.accumulate) std::memset(args.c, 0, sizeof(float) * args.m * args.n);
    return;
  }
  const double m = static_cast<double>(args.m), n = static_cast<double>(args.n), k = static_cast<double>(args.k);
  const ComputeScope charge(args.trace_name, {.flops = 2 * m * n * k, .bytes = 2 * (m * k + k * n) + 4 * m * n});
#if defined(EPMOE_HAVE_OPENBLAS)
  if (args.compute_dtype == ComputeDType::f32 && f32_gemm_backend() == F32GemmBackend::openblas) {
    // OpenBLAS's OpenMP build takes the caller's OpenMP budget (one thread
    // inside a parallel region). beta = 0 overwrites c without reading it.
    cblas_sgemm(CblasRowMajor, args.transpose_a ? CblasTrans : CblasNoTrans,
                args.transpose_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(args.m),
                static_cast<blasint>(args.n), static_cast<blasint>(args.k), 1.0f, args.a,
                static_cast<blasint>(args.transpose_a ? args.m : args.k), args.b,
                static_cast<blasint>(args.transpose_b ? args.k : args.n), args.accumulate ? 1.0f : 0.0f, args.c,
                static_cast<blasint>(args.n));
    static ImplementationCounter& openblas = implementation_counter("openblas", ComputeDType::f32);
    openblas.count(args);
    return;
  }
#else
  if (args.compute_dtype == ComputeDType::f32) f32_gemm_backend();  // refuses openblas by name
#endif
  if (uses_few_rows_kernel(args)) {
    few_rows_gemm(args.a, args.b, args.c, args.m, args.n, args.k, args.accumulate);
    static ImplementationCounter& few_rows = implementation_counter("epmoe:few_rows", ComputeDType::f32);
    few_rows.count(args);
    return;
  }
  ThreadGemmState& state = thread_state();
  // Kept per version: bf16 copies, packed layouts and f32 copies off the grid.
  const bool off_grid = uses_off_grid_b(args);
  const bool prepare_b = args.b_version != 0 && (args.compute_dtype == ComputeDType::bf16 || args.pack_b || off_grid);
  const std::shared_ptr<WeightEntry> entry = prepare_b ? weight_entry(args) : nullptr;
  const void* a = args.a;
  const void* b = args.b;
  if (args.compute_dtype == ComputeDType::bf16) {
    a = to_bf16(args.a, args.m * args.k, state.a_bf16);
    b = entry ? prepared_bf16(*entry, args) : to_bf16(args.b, args.k * args.n, state.b_bf16);
  }
  const PrimitiveKey exact_key{
      args.m,           args.n, args.k, args.transpose_a, args.transpose_b, args.accumulate, args.compute_dtype,
      compute_threads()};
  const GemmMemoryDescs descs = make_descs(exact_key);
  const dnnl::engine& engine = cpu_engine();
  if (args.pack_b && entry) {
    PrimitiveKey packed_key = exact_key;
    packed_key.pack_b = true;
    PrimitiveKey shape_key = packed_key;  // the plain-layout answer, for every m
    shape_key.m = 0;
    auto plain = state.plain_b_layout.find(shape_key);
    if (plain == state.plain_b_layout.end() || !plain->second) {
      const CachedPrimitive& packed = cached_primitive(state, packed_key);
      const bool plain_layout = is_plain(packed.weights);
      if (plain == state.plain_b_layout.end()) state.plain_b_layout.emplace(shape_key, plain_layout);
      if (!plain_layout) {
        const memory& b_mem = prepared_packed(*entry, args, descs.b, b, packed.weights, state.stream);
        memory a_mem(descs.a, engine, const_cast<void*>(a));
        memory c_mem(descs.c, engine, args.c);
        packed.primitive.execute(state.stream,
                                 {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
        packed.counter->count(args);
        return;
      }
    }
    // A plain layout: nothing to pack, the default path below (same bits).
  }
  if (off_grid) b = prepared_off_grid(*entry, args);
  // Ragged groups: one runtime-dimension primitive (oneDNN 2.6 serves it with
  // gemm:jit; runtime strides would fall back to its reference kernel) or one
  // brgemm primitive per exact shape (100-230 us to create each new shape)?
  // Measured in-process on grouped products, Zipf sizes redrawn every call
  // (M = 8192, H = 1024, F = 512, 2 threads, min of 10, busy machine: +-6%),
  // exact-shape time / runtime-dimension time:
  //   E = 16: f32 fwd 0.96, drhs 0.98; bf16 fwd 1.15, dlhs 1.23, drhs 1.85
  //   E = 64: f32 fwd 1.28, drhs 1.04; bf16 fwd 1.00, dlhs 1.21, drhs 1.51
  // and with sizes fixed (every shape cached) 0.90-1.20. The exception is
  // f32 with b transposed (dlhs): there gemm:jit was 0.81x (E = 64, fresh
  // sizes) and 0.72x (fixed) of brgemm, so that case caches exact shapes,
  // where the exact shape reaches another kernel than runtime m does
  // (runtime_m_keeps_the_kernel): on AVX2, where both are gemm:jit, a new
  // exact shape every step was only the cost of creating it (the main job's
  // experts backward 21.4 -> 19.2 ms per step with runtime m, same losses).
  // Runtime dimensions also bound the cache, which with exact shapes grows
  // by up to G shapes every step.
  PrimitiveKey primitive_key = exact_key;
  if (args.dynamic_dim == GemmDynamicDim::m && !args.transpose_a &&
      !(args.transpose_b && args.compute_dtype == ComputeDType::f32 && !runtime_m_keeps_the_kernel(state, exact_key))) {
    primitive_key.m = DNNL_RUNTIME_DIM_VAL;
  } else if (args.dynamic_dim == GemmDynamicDim::k && args.transpose_a && !args.transpose_b) {
    primitive_key.k = DNNL_RUNTIME_DIM_VAL;
  }
  const CachedPrimitive& cached = cached_primitive(state, primitive_key);
  memory a_mem(descs.a, engine, const_cast<void*>(a));
  memory b_mem(descs.b, engine, const_cast<void*>(b));
  memory c_mem(descs.c, engine, args.c);
  cached.primitive.execute(state.stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
  cached.counter->count(args);
  // Runs are synchronous on a CPU stream with the OpenMP runtime; no wait needed.
}

std::vector<GemmImplementationUse> gemm_implementation_census() {
  std::vector<GemmImplementationUse> uses;
  ImplementationCensus& census = implementation_census();
  {
    const std::lock_guard lock(census.mutex);
    for (const ImplementationCounter& counter : census.counters) {
      const std::int64_t calls = counter.calls.load(std::memory_order_relaxed);
      const std::int64_t primitives = counter.primitives.load(std::memory_order_relaxed);
      if (calls > 0 || primitives > 0)
        uses.push_back({counter.implementation, counter.compute_dtype, calls,
                        counter.flops.load(std::memory_order_relaxed), primitives});
    }
  }
  std::stable_sort(uses.begin(), uses.end(), [](const auto& x, const auto& y) { return x.flops > y.flops; });
  return uses;
}

void reset_gemm_implementation_census() {
  ImplementationCensus& census = implementation_census();
  const std::lock_guard lock(census.mutex);
  for (ImplementationCounter& counter : census.counters) {
    counter.calls.store(0, std::memory_order_relaxed);
    counter.flops.store(0, std::memory_order_relaxed);
    counter.primitives.store(0, std::memory_order_relaxed);
  }
}

bool gemm_runtime_m_keeps_the_kernel(std::int64_t n, std::int64_t k, bool transpose_b, ComputeDType dtype) {
  return runtime_m_keeps_the_kernel(thread_state(), {0, n, k, false, transpose_b, false, dtype, compute_threads()});
}

bool gemm_packs_weights(std::int64_t m, std::int64_t n, std::int64_t k, bool transpose_b, ComputeDType dtype) {
  static std::mutex mutex;
  static std::unordered_map<PrimitiveKey, bool, PrimitiveKeyHash> answers;
  const PrimitiveKey key{m, n, k, false, transpose_b, false, dtype, /*num_threads=*/1, /*pack_b=*/true};
  {
    const std::lock_guard lock(mutex);
    if (auto it = answers.find(key); it != answers.end()) return it->second;
  }
  bool packs = false;
  try {
    packs = !is_plain(make_primitive(key).weights);
  } catch (const ConfigError&) {
  } catch (const dnnl::error&) {
  }
  const std::lock_guard lock(mutex);
  answers.emplace(key, packs);
  return packs;
}

bool bf16_gemm_supported() {
  static const bool supported = [] {
    const float a[4] = {1, 2, 3, 4};
    float c[4];
    try {
      gemm({.a = a, .b = a, .c = c, .m = 2, .n = 2, .k = 2, .compute_dtype = ComputeDType::bf16});
    } catch (const ConfigError&) {
      return false;
    }
    return true;
  }();
  return supported;
}

}  // namespace epmoe
