// One expert-parallel MoE layer run the way an engine embeds epmoe: per
// rank, in the caller's own processes or threads, on a communicator the
// caller owns, the layer's outputs written into the caller's buffers.
//
//   mpirun -np 3 embed_per_rank OUT_DIR [key=value ...]   one rank per process (MPI)
//   embed_per_rank --threads 3 OUT_DIR [key=value ...]    three ranks as threads
//
// Every rank makes the same arrays from one seed (x [64, 32], 12 experts of
// F = 48, top_k from the keys, default 2) and takes its share: tokens
// [r*N/R, (r+1)*N/R) and experts [r*E/R, (r+1)*E/R). The keys are those of
// `epmoe layer` (dispatch, dedup, token_chunks, fp8_tokens, balance, ...),
// read with epmoe::config_from_keys. Rank 0 writes the inputs to
// OUT_DIR/inputs and the outputs, gathered in rank order (dgate summed in
// rank order), to OUT_DIR, so that `epmoe layer --in OUT_DIR/inputs
// ranks=R <keys>` can be compared with them file for file.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <epmoe/ep_group.h>
#include <epmoe/error.h>
#include <epmoe/keys.h>
#include <epmoe/moe_layer.h>
#include <epmoe/mpi_communicator.h>
#include <epmoe/npy.h>
#include <epmoe/threads_world.h>

namespace {

using epmoe::MutableTensorView;
using epmoe::TensorView;

constexpr std::int64_t kTokens = 64, kHidden = 32, kFfn = 48;
constexpr int kExperts = 12;

// The whole problem, the same on every rank (one seed).
struct Problem {
  explicit Problem(int top_k) : top_k(top_k) {
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 0.5f);
    for (std::vector<float>* v : {&x, &gate, &wi0, &wi1, &wo, &dy})
      for (float& value : *v) value = normal(rng);
  }
  int top_k;
  std::vector<float> x = std::vector<float>(kTokens * kHidden), gate = std::vector<float>(kHidden * kExperts),
                     wi0 = std::vector<float>(kExperts * kHidden * kFfn),
                     wi1 = std::vector<float>(kExperts * kHidden * kFfn),
                     wo = std::vector<float>(kExperts * kFfn * kHidden), dy = std::vector<float>(kTokens * kHidden);
};

// Where every output goes, whole (rank order).
struct Outputs {
  explicit Outputs(int top_k, int num_ranks)
      : topk_ids(kTokens * top_k), topk_weights(kTokens * top_k), dgate_parts(num_ranks) {
    for (std::vector<float>& part : dgate_parts) part.resize(kHidden * kExperts);
  }
  std::vector<float> y = std::vector<float>(kTokens * kHidden), dx = std::vector<float>(kTokens * kHidden);
  std::vector<std::int32_t> topk_ids;
  std::vector<float> topk_weights;
  std::vector<float> dwi0 = std::vector<float>(kExperts * kHidden * kFfn),
                     dwi1 = std::vector<float>(kExperts * kHidden * kFfn),
                     dwo = std::vector<float>(kExperts * kFfn * kHidden);
  std::vector<std::vector<float>> dgate_parts;  // [rank]
};

std::int64_t first_token(int rank, int num_ranks) { return kTokens * rank / num_ranks; }

// One rank's step: its share of the inputs as views (no copy), its outputs
// straight into its rows of `out` (the caller's buffers).
void run_rank(epmoe::Communicator& comm, const std::map<std::string, std::string>& keys, const Problem& p,
              Outputs& out) {
  const int r = comm.rank(), num_ranks = comm.size(), k = p.top_k;
  const epmoe::LayerConfigs configs = epmoe::config_from_keys(keys, kHidden, kFfn, kExperts);
  epmoe::EpGroup group(comm, configs.ep);
  epmoe::MoeLayer layer(configs.layer, group);
  const std::int64_t t0 = first_token(r, num_ranks), n = first_token(r + 1, num_ranks) - t0;
  const std::int64_t el = group.num_local_experts(), e0 = group.first_local_expert();
  const std::int64_t hf = kHidden * kFfn;
  const epmoe::MoeWeights weights{.gate = TensorView(p.gate.data(), {kHidden, kExperts}),
                                  .wi0 = TensorView(p.wi0.data() + e0 * hf, {el, kHidden, kFfn}),
                                  .wi1 = TensorView(p.wi1.data() + e0 * hf, {el, kHidden, kFfn}),
                                  .wo = TensorView(p.wo.data() + e0 * hf, {el, kFfn, kHidden})};
  layer.forward(TensorView(p.x.data() + t0 * kHidden, {n, kHidden}), weights, {},
                {.y = MutableTensorView(out.y.data() + t0 * kHidden, {n, kHidden}),
                 .topk_ids = MutableTensorView(out.topk_ids.data() + t0 * k, {n, k}),
                 .topk_weights = MutableTensorView(out.topk_weights.data() + t0 * k, {n, k})});
  layer.backward(TensorView(p.dy.data() + t0 * kHidden, {n, kHidden}), {},
                 {.dx = MutableTensorView(out.dx.data() + t0 * kHidden, {n, kHidden}),
                  .dgate = MutableTensorView(out.dgate_parts[r].data(), {kHidden, kExperts}),
                  .dwi0 = MutableTensorView(out.dwi0.data() + e0 * hf, {el, kHidden, kFfn}),
                  .dwi1 = MutableTensorView(out.dwi1.data() + e0 * hf, {el, kHidden, kFfn}),
                  .dwo = MutableTensorView(out.dwo.data() + e0 * hf, {el, kFfn, kHidden})});
}

// Under MPI each process filled only its own rows: rank 0 collects the
// others' (the caller's MPI, as an engine would; epmoe is not involved).
void gather_to_rank_zero(Outputs& out, int top_k, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const auto gather_rows = [&](void* data, MPI_Datatype type, std::int64_t row_elements,
                               const std::vector<std::int64_t>& first_row) {
    std::vector<int> counts(size), displacements(size);
    for (int q = 0; q < size; ++q) {
      counts[q] = static_cast<int>((first_row[q + 1] - first_row[q]) * row_elements);
      displacements[q] = static_cast<int>(first_row[q] * row_elements);
    }
    int type_size = 0;
    MPI_Type_size(type, &type_size);
    void* mine = static_cast<char*>(data) + static_cast<std::size_t>(displacements[rank]) * type_size;
    MPI_Gatherv(rank == 0 ? MPI_IN_PLACE : mine, counts[rank], type, data, counts.data(), displacements.data(), type, 0,
                comm);
  };
  std::vector<std::int64_t> token_rows(size + 1), expert_rows(size + 1);
  for (int q = 0; q <= size; ++q) {
    token_rows[q] = first_token(q, size);
    expert_rows[q] = std::int64_t{kExperts} * q / size;
  }
  gather_rows(out.y.data(), MPI_FLOAT, kHidden, token_rows);
  gather_rows(out.topk_ids.data(), MPI_INT32_T, top_k, token_rows);
  gather_rows(out.topk_weights.data(), MPI_FLOAT, top_k, token_rows);
  gather_rows(out.dx.data(), MPI_FLOAT, kHidden, token_rows);
  gather_rows(out.dwi0.data(), MPI_FLOAT, kHidden * kFfn, expert_rows);
  gather_rows(out.dwi1.data(), MPI_FLOAT, kHidden * kFfn, expert_rows);
  gather_rows(out.dwo.data(), MPI_FLOAT, kHidden * kFfn, expert_rows);
  std::vector<float> all_parts(static_cast<std::size_t>(size) * kHidden * kExperts);
  MPI_Gather(out.dgate_parts[rank].data(), kHidden * kExperts, MPI_FLOAT, all_parts.data(), kHidden * kExperts,
             MPI_FLOAT, 0, comm);
  if (rank == 0)
    for (int q = 0; q < size; ++q)
      std::memcpy(out.dgate_parts[q].data(), all_parts.data() + q * kHidden * kExperts, kHidden * kExperts * 4);
}

void write_all(const std::filesystem::path& dir, const Problem& p, const Outputs& out) {
  const int k = p.top_k;
  std::filesystem::create_directories(dir / "inputs");
  const std::pair<const char*, TensorView> inputs[] = {{"x", TensorView(p.x.data(), {kTokens, kHidden})},
                                                       {"gate", TensorView(p.gate.data(), {kHidden, kExperts})},
                                                       {"wi0", TensorView(p.wi0.data(), {kExperts, kHidden, kFfn})},
                                                       {"wi1", TensorView(p.wi1.data(), {kExperts, kHidden, kFfn})},
                                                       {"wo", TensorView(p.wo.data(), {kExperts, kFfn, kHidden})},
                                                       {"dy", TensorView(p.dy.data(), {kTokens, kHidden})}};
  for (const auto& [name, view] : inputs)
    epmoe::write_npy((dir / "inputs" / (std::string(name) + ".npy")).string(), view);
  // The gate is replicated: its gradient is every rank's part, summed in rank order.
  std::vector<float> dgate = out.dgate_parts[0];
  for (std::size_t q = 1; q < out.dgate_parts.size(); ++q)
    for (std::size_t i = 0; i < dgate.size(); ++i) dgate[i] += out.dgate_parts[q][i];
  const std::pair<const char*, TensorView> outputs[] = {
      {"y", TensorView(out.y.data(), {kTokens, kHidden})},
      {"topk_ids", TensorView(out.topk_ids.data(), {kTokens, k})},
      {"topk_weights", TensorView(out.topk_weights.data(), {kTokens, k})},
      {"dx", TensorView(out.dx.data(), {kTokens, kHidden})},
      {"dgate", TensorView(dgate.data(), {kHidden, kExperts})},
      {"dwi0", TensorView(out.dwi0.data(), {kExperts, kHidden, kFfn})},
      {"dwi1", TensorView(out.dwi1.data(), {kExperts, kHidden, kFfn})},
      {"dwo", TensorView(out.dwo.data(), {kExperts, kFfn, kHidden})}};
  for (const auto& [name, view] : outputs) epmoe::write_npy((dir / (std::string(name) + ".npy")).string(), view);
}

int usage() {
  std::fprintf(stderr, "usage: embed_per_rank [--threads R] OUT_DIR [key=value ...]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int arg = 1, num_threads = 0;
  if (argc > 2 && std::string(argv[1]) == "--threads") {
    num_threads = std::atoi(argv[2]);
    arg = 3;
  }
  if (arg >= argc) return usage();
  const std::filesystem::path out_dir = argv[arg++];
  std::map<std::string, std::string> keys;
  for (; arg < argc; ++arg) {
    const std::string assignment = argv[arg];
    const std::size_t equals = assignment.find('=');
    if (equals == std::string::npos) return usage();
    keys[assignment.substr(0, equals)] = assignment.substr(equals + 1);
  }
  const int top_k = keys.count("top_k") ? std::stoi(keys.at("top_k")) : 2;
  const Problem problem(top_k);

  if (num_threads > 0) {
    try {
      Outputs out(top_k, num_threads);
      epmoe::run_ranks(num_threads, [&](epmoe::Communicator& comm) { run_rank(comm, keys, problem, out); });
      write_all(out_dir, problem, out);
      return 0;
    } catch (const epmoe::Error& e) {
      std::fprintf(stderr, "embed_per_rank: %s\n", e.what());
      return 1;
    }
  }

  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  try {
    Outputs out(top_k, size);
    {
      const std::unique_ptr<epmoe::Communicator> comm = epmoe::make_mpi_communicator(MPI_COMM_WORLD);
      run_rank(*comm, keys, problem, out);
    }  // the communicator goes before MPI_Finalize
    gather_to_rank_zero(out, top_k, MPI_COMM_WORLD);
    if (rank == 0) write_all(out_dir, problem, out);
  } catch (const epmoe::Error& e) {
    // One rank's error ends every rank at once (they may wait for it).
    std::fprintf(stderr, "embed_per_rank: rank %d failed: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return 0;
}
