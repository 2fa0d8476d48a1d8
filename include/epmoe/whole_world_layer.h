// epmoe::WholeWorldLayer: one routed MoE layer, forward and (with dy)
// backward, expert parallel over R rank threads of this process inside each
// call, on the caller's own full (unsharded) arrays. A harness on the
// per-rank API (<epmoe/ep_group.h>, <epmoe/moe_layer.h>): what `epmoe layer`
// runs, so its outputs have the same bits as that command's .npy files.
// For an engine that runs its own ranks (its processes under mpirun, or its
// threads), the per-rank API is the one to use; this is for a whole problem
// in one process (tests, references, single-machine runs).
//
//   epmoe::WholeWorldLayer layer({{"ranks", "2"}, {"top_k", "2"}, {"dispatch", "ring"}});
//   epmoe::LayerArrays in{.x = x, .gate = gate, .wi0 = wi0, .wi1 = wi1, .wo = wo, .dy = dy};
//   layer.run(in, out);                          // out: views of the caller's output buffers
//   std::string metrics = layer.metrics_json();  // what epmoe layer writes to metrics.json
//
// The R rank threads and every rank's EP group, layer and buffers are kept
// between calls (built at the first call, again only when the arrays' shape
// changes or a call failed), so a call costs the layer's own compute plus a
// wake-up of the threads. Inputs are read in place, never copied in: rank r
// reads its rows of x and dy and its experts' rows of wi0, wi1, wo through
// views of the caller's arrays (which must stay alive and unchanged during
// run()). Each rank writes its rows of the outputs straight into the
// caller's buffers; dgate is every rank's part summed in rank order.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <epmoe/tensor_view.h>

namespace epmoe {

// The full (unsharded) arrays of one layer, float32, C-contiguous. Every
// member has a default (= {}), so designated initialisers may leave the
// optional ones out without -Wmissing-field-initializers warnings.
struct LayerArrays {
  TensorView x = {};     // [N, H]
  TensorView gate = {};  // [H, E], replicated
  TensorView wi0 = {};   // [E, H, F]
  TensorView wi1 = {};   // [E, H, F]
  TensorView wo = {};    // [E, F, H]
  TensorView bias = {};  // [E]; empty: none (only router=sigmoid_grouped uses one)
  TensorView dy = {};    // [N, H]; empty: forward only
};

// Where run() writes its results: the caller's buffers, C-contiguous, of
// exactly these shapes and dtypes (as `epmoe layer` writes its .npy files).
// The gradients are required when LayerArrays::dy is given and must be empty
// otherwise.
struct LayerOutputs {
  MutableTensorView y = {};             // [N, H] f32
  MutableTensorView topk_ids = {};      // [N, K] i32
  MutableTensorView topk_weights = {};  // [N, K] f32
  MutableTensorView dx = {};            // [N, H] f32
  MutableTensorView dgate = {};         // [H, E] f32: every rank's part summed in rank order
  MutableTensorView dwi0 = {};          // [E, H, F] f32
  MutableTensorView dwi1 = {};          // [E, H, F] f32
  MutableTensorView dwo = {};           // [E, F, H] f32
};

class WholeWorldLayer {
 public:
  // `keys`: any key of `epmoe layer` (`epmoe layer --help` lists them with
  // their defaults), as text: {"ranks", "4"}, {"dispatch", "alltoall"},
  // {"dedup", "true"}, ... An unknown key or a bad value throws
  // epmoe::ConfigError (<epmoe/error.h>) naming the key and the rule. Rules
  // that need the arrays' dimensions (top_k <= E, ranks divides E) are checked
  // by run(). transport=mpi is refused: a process that uses MPI runs the
  // per-rank API on its own communicator (<epmoe/mpi_communicator.h>).
  // trace_file=PATH: each successful run() writes its Chrome trace there
  // (the last call's timeline); the path is checked here and before each
  // call's compute (FileError naming trace_file). fault_injection= (a test
  // hook, docs/RELIABILITY.md) applies to this layer's calls only, counted
  // across them.
  explicit WholeWorldLayer(const std::map<std::string, std::string>& keys = {});
  ~WholeWorldLayer();
  WholeWorldLayer(WholeWorldLayer&&) noexcept;
  WholeWorldLayer& operator=(WholeWorldLayer&&) noexcept;

  // K, the experts each token is routed to (top_k=): the second dimension of
  // LayerOutputs::topk_ids and topk_weights.
  int top_k() const;

  // Runs the layer: checks every view (UsageError naming a view with a null
  // data pointer and elements, "LayerArrays::x: null data pointer for a
  // 16x8 view"), every shape and dtype (ConfigError naming the array, its
  // shape and the expected one), refuses non-finite inputs (NumericError
  // naming the array and index), then computes and writes the outputs. Blocks until done; a rank's failure ends every
  // rank's wait and is rethrown here.
  void run(const LayerArrays& arrays, const LayerOutputs& outputs);

  // What `epmoe layer` writes to metrics.json for the last successful run(),
  // as JSON text: timings, bytes per collective, per-rank loads. Made when
  // asked (it costs more than a small layer's call: ~0.15 ms at N=64),
  // UsageError before the first run.
  std::string metrics_json() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace epmoe
