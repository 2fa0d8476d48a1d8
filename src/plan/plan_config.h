// PlanConfig: what `epmoe plan` projects — a model on a device type, a
// parallel layout, the dispatcher and its options, and which activations the
// backward finds saved. Derived sizes that memory, bytes and time all use
// (tokens per device, routed rows per rank, bytes per element) live here, once.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/x_sorted_size.h"

#include "hardware/hardware.h"
#include "plan/communication_model.h"
#include "plan/model.h"

namespace epmoe::plan {

struct ParallelismSpec {
  std::int64_t dp = 1;               // data-parallel replicas (weights replicated, gradients all-reduced)
  std::int64_t fsdp = 1;             // weights, gradients, optimizer state sharded; batch sharded
  std::int64_t ep = 1;               // experts sharded (R); batch sharded too, as MaxText's expert axis does
  std::int64_t tp = 1;               // heads and F sharded; tokens replicated within the group
  double per_device_batch_size = 1;  // sequences per device, MaxText's meaning (global batch / devices)
  std::int64_t seq_len = 4096;

  std::int64_t num_devices() const { return dp * fsdp * ep * tp; }
  // Tokens one device's layers process: the batch is sharded over dp, fsdp
  // and ep, and replicated over tp.
  double tokens_per_device() const { return per_device_batch_size * double(tp) * double(seq_len); }
};

// Where the backward finds an activation (MaxText's remat policy values:
// device = save, offload = host memory, remat = recompute).
enum class RematChoice { save, remat, offload };

// The named activations, in layer order. decoder_layer_input [T, H] is the
// layer's input (MaxText's scan carry); query_proj / key_proj / value_proj
// the attention projections; context the attention output before the out
// projection [T, heads, v]; out_proj [T, H]; then the MLP / expert names of
// ep/remat_policy.h. The MLP names also cover the dense layers' MLP and the
// shared experts, as MaxText tags them with the same names.
const std::vector<std::string>& activation_names();
// The choices a name accepts: decoder_layer_input cannot be recomputed (it is
// the previous layer's output), so save|offload; the rest save|remat|offload.
std::vector<std::string> remat_choices(const std::string& name);

enum class TokenTransfer { activation_dtype, fp8_tensor, fp8_token };  // key fp8_tokens=off|tensor|token
enum class ElementType { bf16, f32 };
enum class MatmulType { bf16, fp8 };

struct PlanConfig {
  ModelSpec model;
  hardware::HardwareSpec hardware;
  ParallelismSpec parallel;
  DispatchKind dispatch = DispatchKind::ring;
  bool dedup = false;  // alltoall only; the report shows both anyway
  TokenTransfer token_transfer = TokenTransfer::activation_dtype;
  ElementType activation_type = ElementType::bf16;  // saved activations and gradients on the wire
  MatmulType matmul_type = MatmulType::bf16;        // which peak FLOP rate applies
  // Routed rows a rank's buffers hold, as a multiple of the balanced count
  // N_l·K (MaxText's ragged_buffer_factor); 0 = the no-drop worst case R·N_l·K.
  double token_buffer_factor = 1.0;
  std::int64_t redundant_slots = 0;  // B replica slots per rank and MoE layer
  bool replica_costs_priced = true;  // replica_costs=priced (epmoe layer's and train's default) or off
  // The MoE layer's tokens in n pipelined chunks (MaxText num_moe_token_chunks):
  // only one chunk's dispatch buffers and expert intermediates are live.
  std::int64_t token_chunks = 1;
  std::map<std::string, RematChoice> remat;  // every activation_names() entry
  double usable_memory_fraction = 0.95;      // of HBM, the rest is runtime + fragmentation (assumption)
  double compute_efficiency = 0.5;           // achieved / peak FLOP rate (assumption)

  // ConfigError naming the key (ep divides E, tp divides heads and F, ...).
  void validate() const;

  RematChoice choice(const std::string& name) const { return remat.at(name); }
  double activation_bytes() const { return activation_type == ElementType::bf16 ? 2.0 : 4.0; }
  // The form a saved x_sorted keeps its rows in (core/x_sorted_size.h): the
  // transfer format with fp8 tokens, else the activation type.
  SavedRowForm saved_row_form() const;
  // One token row as it travels forward (and as x_sorted is saved, see memory_model.h).
  double token_row_bytes() const;
  DispatchShape dispatch_shape() const;
  // Routed (token, expert) rows one rank's experts compute on in expectation:
  // N_l·K (uniform routing; E_l/E of the R·N_l·K pairs).
  double expected_routed_rows() const;
  // Rows its buffers (and a saved x_sorted) are sized for: factor·N_l·K, or
  // R·N_l·K when the factor is 0.
  double buffered_routed_rows() const;
};

// The defaults of MaxText's remat_policy=custom: decoder_layer_input on
// device, everything else recomputed.
std::map<std::string, RematChoice> default_remat();
std::string to_string(RematChoice choice);

}  // namespace epmoe::plan
