#include "model/checkpoint.h"

#include <algorithm>
#include <cstring>

#include "comm/barrier.h"
#include "core/error.h"
#include "core/fault_injection.h"
#include "core/finite_check.h"

namespace epmoe {
namespace {

std::string directory_of(const Parameter& p, int rank) {
  return p.replicated ? "replicated/" : "rank_" + std::to_string(rank) + "/";
}

// The three files of a parameter: value, AdamW m, AdamW v.
std::vector<std::pair<std::string, const Tensor*>> files_of(const Parameter& p, int rank) {
  const std::string base = directory_of(p, rank) + p.name;
  return {{base + ".npy", &p.value}, {base + ".adam_m.npy", &p.adam_m}, {base + ".adam_v.npy", &p.adam_v}};
}

std::string buffer_file(const Buffer& b) { return "replicated/" + b.name + ".npy"; }
std::string state_file(const OpaqueState& s) { return "replicated/" + s.name + ".npy"; }

// The opaque states that have something to save, as 1-D i64 tensors.
std::vector<std::pair<std::string, Tensor>> saved_states(const ParameterSet& state) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const OpaqueState& s : state.states()) {
    const std::vector<std::int64_t> values = s.save();
    if (values.empty()) continue;
    Tensor tensor(DType::i64, {static_cast<std::int64_t>(values.size())});
    std::copy(values.begin(), values.end(), tensor.data<std::int64_t>());
    out.emplace_back(state_file(s), std::move(tensor));
  }
  return out;
}

void wait_for_all(const CheckpointContext& context, std::uint32_t offset) {
  comm::barrier(*context.comm, {.tag = context.barrier_tag + offset, .timeout = context.timeout}).wait();
}

// A NaN or infinity in a checkpoint would poison every later step (AdamW
// spreads it through the moments), and a run never saves one (it stops on a
// non-finite loss or gradient norm before the update), so one found here is
// damage: refused as a bad file, naming it and its first bad element.
void check_finite_file(const std::filesystem::path& path, const Tensor& loaded) {
  const std::int64_t bad = find_non_finite(loaded);  // integer tensors are always finite
  if (bad < 0) return;
  throw FileError(path.string() + ": element " + index_to_string(loaded.shape(), bad) + " is " +
                  value_to_string(loaded.data<float>()[bad]) +
                  "; a checkpoint holds finite numbers only (this one is damaged)");
}

Tensor read_checked(const CheckpointStore& store, std::int64_t step, const std::string& file) {
  Tensor loaded = store.read_tensor(step, file);
  check_finite_file(store.step_dir(step) / file, loaded);
  return loaded;
}

[[noreturn]] void refuse_shape(const CheckpointStore& store, std::int64_t step, const std::string& file,
                               const Shape& got, const Shape& expected) {
  throw FileError((store.step_dir(step) / file).string() + ": holds " + shape_to_string(got) +
                  " but this run's tensor is " + shape_to_string(expected) +
                  "; the checkpoint belongs to a different model");
}

void copy_checked(const CheckpointStore& store, std::int64_t step, const std::string& file, Tensor& target) {
  Tensor loaded = read_checked(store, step, file);
  if (loaded.dtype() != target.dtype() || loaded.shape() != target.shape()) {
    refuse_shape(store, step, file, loaded.shape(), target.shape());
  }
  if (target.size_bytes() > 0) std::memcpy(target.raw(), loaded.raw(), static_cast<std::size_t>(target.size_bytes()));
}

// Rank `rank` of `num_ranks`' experts of one sharded tensor (value or a
// moment, [E/R', ...]) from the files of a checkpoint of `saved_ranks` ranks
// ([E/R, ...] each): expert by expert, reading each source file once.
void gather_experts(const CheckpointStore& store, std::int64_t step, const std::string& name_suffix,
                    const std::string& parameter, int rank, int num_ranks, int saved_ranks, Tensor& target) {
  const std::int64_t local = target.shape().at(0);
  const std::int64_t num_experts = local * num_ranks;
  const std::int64_t saved_local = num_experts / saved_ranks;
  Shape saved_shape = target.shape();
  saved_shape[0] = saved_local;
  const std::int64_t expert_bytes = local > 0 ? target.size_bytes() / local : 0;
  int loaded_rank = -1;
  Tensor loaded;
  for (std::int64_t e = rank * local; e < (rank + 1) * local; ++e) {
    const int source = static_cast<int>(e / saved_local);
    const std::string file = "rank_" + std::to_string(source) + "/" + parameter + name_suffix;
    if (source != loaded_rank) {
      loaded = read_checked(store, step, file);
      if (loaded.dtype() != target.dtype() || loaded.shape() != saved_shape) {
        refuse_shape(store, step, file, loaded.shape(), saved_shape);
      }
      loaded_rank = source;
    }
    std::memcpy(static_cast<char*>(target.raw()) + (e - rank * local) * expert_bytes,
                static_cast<const char*>(loaded.raw()) + (e % saved_local) * expert_bytes,
                static_cast<std::size_t>(expert_bytes));
  }
}

}  // namespace

std::vector<std::string> checkpoint_files(const ParameterSet& state, int num_ranks) {
  std::vector<std::string> files;
  for (const Parameter& p : state.parameters()) {
    for (int r = 0; r < (p.replicated ? 1 : num_ranks); ++r) {
      for (const auto& [file, tensor] : files_of(p, r)) files.push_back(file);
    }
  }
  for (const Buffer& b : state.buffers()) files.push_back(buffer_file(b));
  return files;
}

std::int64_t save_checkpoint(const CheckpointStore& store, std::int64_t step, const ParameterSet& state,
                             const nlohmann::json& metadata, const CheckpointContext& context) {
  transport::Communicator& comm = *context.comm;
  const int rank = comm.rank();
  if (rank == 0) store.begin_staging(step);
  wait_for_all(context, 0);  // the staging directory exists
  std::int64_t bytes = 0;
  for (const Parameter& p : state.parameters()) {
    if (p.replicated && rank != 0) continue;  // rank 0 writes the one copy
    for (const auto& [file, tensor] : files_of(p, rank)) {
      store.write_tensor(step, file, *tensor);
      bytes += tensor->size_bytes();
    }
  }
  std::vector<std::string> files = checkpoint_files(state, comm.size());
  if (rank == 0) {
    for (const Buffer& b : state.buffers()) {
      store.write_tensor(step, buffer_file(b), b.value);
      bytes += b.value.size_bytes();
    }
    for (const auto& [file, tensor] : saved_states(state)) {
      store.write_tensor(step, file, tensor);
      bytes += tensor.size_bytes();
      files.push_back(file);
    }
  }
  // Test hook (core/fault_injection.h): a rank failing with its files
  // written and the checkpoint not committed; every rank must stop and no
  // step_<N> may appear.
  fault_point("checkpoint", rank);
  wait_for_all(context, 1);  // every rank's files are written
  if (rank == 0) store.commit(step, files, metadata);
  wait_for_all(context, 2);  // committed: no rank runs ahead of a checkpoint that may still fail
  // Test hook: a run killed right after a commit (its metrics line must
  // already be on disk). On every rank, once all know the commit happened:
  // only rank 0 commits, and a point that only rank 0 reaches never fired
  // for RANK != 0.
  fault_point("checkpoint_committed", rank);
  return bytes;
}

nlohmann::json check_checkpoint_compatibility(const CheckpointStore& store, std::int64_t step,
                                              const nlohmann::json& compatibility) {
  const nlohmann::json manifest = store.manifest(step);  // data files are checked as each rank reads its own
  const std::string where = store.step_dir(step).string();
  const nlohmann::json& metadata = manifest.at("metadata");
  if (!metadata.contains("compatibility") || !metadata["compatibility"].is_object()) {
    throw FileError(where + "/manifest.json: metadata has no \"compatibility\" object; not written by epmoe train");
  }
  const nlohmann::json& saved = metadata["compatibility"];
  for (const auto& [key, value] : compatibility.items()) {
    if (!saved.contains(key)) {
      throw ConfigError(where + " was written without " + key + "; this run needs " + key + "=" + value.dump());
    }
    if (saved[key] != value) {
      throw ConfigError(key + "=" + value.dump() + " differs from the checkpoint's " + key + "=" + saved[key].dump() +
                        " (" + where + "); resume with the same " + key + " or start a new checkpoint_dir");
    }
  }
  return metadata;
}

CheckpointLoad load_checkpoint(const CheckpointStore& store, std::int64_t step, int rank, int num_ranks,
                               ParameterSet& state) {
  const nlohmann::json manifest = store.manifest(step);
  const nlohmann::json& metadata = manifest["metadata"];
  const std::string where = store.step_dir(step).string();
  if (!metadata.contains("num_ranks") || !metadata["num_ranks"].is_number_integer() ||
      metadata["num_ranks"].get<std::int64_t>() < 1) {
    throw FileError(where +
                    "/manifest.json: metadata has no positive integer \"num_ranks\" (the rank count "
                    "that wrote it); not a checkpoint of epmoe train");
  }
  CheckpointLoad result;
  result.saved_num_ranks = metadata["num_ranks"].get<int>();
  const int saved_ranks = result.saved_num_ranks;
  for (Parameter& p : state.parameters()) {
    if (p.replicated || saved_ranks == num_ranks) {
      const auto files = files_of(p, rank);
      copy_checked(store, step, files[0].first, p.value);
      copy_checked(store, step, files[1].first, p.adam_m);
      copy_checked(store, step, files[2].first, p.adam_v);
      continue;
    }
    const std::int64_t num_experts = p.value.shape().at(0) * num_ranks;
    if (num_experts % saved_ranks != 0) {
      throw ConfigError("num_experts=" + std::to_string(num_experts) + " does not divide over the " +
                        std::to_string(saved_ranks) + " ranks of the checkpoint " + where +
                        " (its manifest is inconsistent with this model)");
    }
    gather_experts(store, step, ".npy", p.name, rank, num_ranks, saved_ranks, p.value);
    gather_experts(store, step, ".adam_m.npy", p.name, rank, num_ranks, saved_ranks, p.adam_m);
    gather_experts(store, step, ".adam_v.npy", p.name, rank, num_ranks, saved_ranks, p.adam_v);
  }
  for (Buffer& b : state.buffers()) copy_checked(store, step, buffer_file(b), b.value);
  // States the checkpoint has (a run without replicas saved none).
  for (const OpaqueState& s : state.states()) {
    const std::string file = state_file(s);
    const bool present = std::any_of(manifest["files"].begin(), manifest["files"].end(),
                                     [&](const nlohmann::json& f) { return f["path"] == file; });
    if (!present) continue;
    if (saved_ranks != num_ranks) {
      result.notes.push_back(s.name + ": the replica planning state of " + std::to_string(saved_ranks) +
                             " ranks does not apply to " + std::to_string(num_ranks) +
                             "; it is reset (replicas are planned afresh; they change where experts compute, not what, "
                             "so the losses differ only by fp32 rounding)");
      continue;
    }
    const Tensor saved = store.read_tensor(step, file);
    if (saved.dtype() != DType::i64 || saved.rank() != 1) {
      throw FileError((store.step_dir(step) / file).string() + ": expected a 1-D int64 array");
    }
    s.restore({saved.data<std::int64_t>(), saved.data<std::int64_t>() + saved.numel()});
  }
  return result;
}

}  // namespace epmoe
