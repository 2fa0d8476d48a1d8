#include "model/checkpoint.h"

#include <algorithm>
#include <cstring>

#include "comm/barrier.h"
#include "core/error.h"

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

void copy_checked(const CheckpointStore& store, std::int64_t step, const std::string& file, Tensor& target) {
  Tensor loaded = store.read_tensor(step, file);
  if (loaded.dtype() != target.dtype() || loaded.shape() != target.shape()) {
    throw FileError((store.step_dir(step) / file).string() + ": holds " + shape_to_string(loaded.shape()) +
                    " but this run's tensor is " + shape_to_string(target.shape()) +
                    "; the checkpoint belongs to a different model");
  }
  if (target.size_bytes() > 0) std::memcpy(target.raw(), loaded.raw(), static_cast<std::size_t>(target.size_bytes()));
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
  wait_for_all(context, 1);  // every rank's files are written
  if (rank == 0) store.commit(step, files, metadata);
  wait_for_all(context, 2);  // committed: no rank runs ahead of a checkpoint that may still fail
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
      throw ConfigError(key + "=" + value.dump() + " differs from the checkpoint's " + key + "=" +
                        saved[key].dump() + " (" + where + "); resume with the same " + key +
                        " or start a new checkpoint_dir");
    }
  }
  return metadata;
}

void load_checkpoint(const CheckpointStore& store, std::int64_t step, int rank, ParameterSet& state) {
  for (Parameter& p : state.parameters()) {
    const auto files = files_of(p, rank);
    copy_checked(store, step, files[0].first, p.value);
    copy_checked(store, step, files[1].first, p.adam_m);
    copy_checked(store, step, files[2].first, p.adam_v);
  }
  for (Buffer& b : state.buffers()) copy_checked(store, step, buffer_file(b), b.value);
  // States the checkpoint has (a run without replicas saved none).
  const nlohmann::json manifest = store.manifest(step);
  for (const OpaqueState& s : state.states()) {
    const std::string file = state_file(s);
    const bool present = std::any_of(manifest["files"].begin(), manifest["files"].end(),
                                     [&](const nlohmann::json& f) { return f["path"] == file; });
    if (!present) continue;
    const Tensor saved = store.read_tensor(step, file);
    if (saved.dtype() != DType::i64 || saved.rank() != 1) {
      throw FileError((store.step_dir(step) / file).string() + ": expected a 1-D int64 array");
    }
    s.restore({saved.data<std::int64_t>(), saved.data<std::int64_t>() + saved.numel()});
  }
}

}  // namespace epmoe
