// Training checkpoints of a ParameterSet across ranks (DESIGN.md §4.9), on
// the file layer of data/checkpoint_store.h (staged directory, .npy files,
// CRC-32 manifest, atomic rename):
//
//   step_<N>/replicated/<name>.npy, <name>.adam_m.npy, <name>.adam_v.npy
//                                  replicated parameters and buffers, rank 0
//                                  and opaque states (replica planning), rank 0
//   step_<N>/rank_<r>/<name>.npy, ...   rank r's experts (sharded parameters)
//   step_<N>/manifest.json         step, rank count, the run's config, checksums
//
// N counts completed steps, so resuming from step_<N> runs step N next. A
// checkpoint is written collectively (every rank calls save_checkpoint): rank
// 0 stages, everyone writes its files, rank 0 commits. Loading checks that
// the checkpoint was written for the same model shape, verifies every file
// it reads against the manifest's checksum and refuses non-finite numbers.
//
// Elastic resume: a checkpoint of R ranks loads on R' ranks (E divisible by
// both). Expert e is row e % (E/R) of rank_<e / (E/R)>/'s files; rank r' of
// the new run gathers rows [r'·E/R', (r'+1)·E/R') from the one or several
// files that hold them, AdamW moments with them, so the state is exactly
// the saved one, resharded. Replica planning state (balance=dynamic or
// periodic) describes slots of R ranks and cannot be resharded: it is reset
// (fresh plans from the next step, which changes no loss: replicas move
// where experts compute, not what) and a note says so.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/checkpoint_store.h"
#include "model/parameters.h"
#include "transport/communicator.h"

namespace epmoe {

struct CheckpointContext {
  transport::Communicator* comm = nullptr;
  std::uint32_t barrier_tag = 0;  // collective tags barrier_tag .. barrier_tag + 2
  std::chrono::milliseconds timeout{60000};
};

// Every tensor file of the checkpoint, all ranks' (rank 0 lists them in the
// manifest, with the opaque states it saved).
std::vector<std::string> checkpoint_files(const ParameterSet& state, int num_ranks);

// Collective. `metadata` (a JSON object; rank 0's is written) must hold
// "compatibility": the settings a resumed run must share (see
// check_checkpoint_compatibility). Returns the bytes this rank wrote.
std::int64_t save_checkpoint(const CheckpointStore& store, std::int64_t step, const ParameterSet& state,
                             const nlohmann::json& metadata, const CheckpointContext& context);

// The manifest's metadata of step `step` after checking the manifest (not
// the data files: load_checkpoint checks each file it reads); then
// ConfigError when its "compatibility" object differs from `compatibility`
// in any key (naming the key, both values and the checkpoint).
nlohmann::json check_checkpoint_compatibility(const CheckpointStore& store, std::int64_t step,
                                              const nlohmann::json& compatibility);

struct CheckpointLoad {
  int saved_num_ranks = 0;         // R of the run that wrote it
  std::vector<std::string> notes;  // what was not restored as saved, and why
};

// Reads this rank's parameters, moments and buffers of step `step` into
// `state`, this rank being `rank` of `num_ranks` (resharding the experts when
// the checkpoint has another rank count). FileError naming the file when a
// shape does not match or a value is NaN/inf (with its first index);
// ConfigError when the experts do not divide over the checkpoint's ranks.
CheckpointLoad load_checkpoint(const CheckpointStore& store, std::int64_t step, int rank, int num_ranks,
                               ParameterSet& state);

}  // namespace epmoe
