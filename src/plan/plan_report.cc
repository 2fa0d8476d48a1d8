#include "plan/plan_report.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/error.h"

namespace epmoe::plan {
namespace {

std::string gb(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GB", bytes / 1e9);
  return text;
}

std::string fixed(double value, int digits) {
  char text[48];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

std::string token_transfer_name(TokenTransfer t) {
  switch (t) {
    case TokenTransfer::activation_dtype:
      return "off";
    case TokenTransfer::fp8_tensor:
      return "tensor";
    case TokenTransfer::fp8_token:
      return "token";
  }
  return "?";
}

DispatcherBytes dispatcher_bytes(const PlanConfig& c, DispatchKind kind, bool dedup) {
  DispatcherBytes d;
  d.kind = kind;
  d.dedup = dedup;
  d.label = kind == DispatchKind::ring ? "ring" : (dedup ? "alltoall+dedup" : "alltoall");
  const DispatchShape shape = c.dispatch_shape();
  const bool remat_x_sorted = c.choice("x_sorted") == RematChoice::remat;
  if (c.parallel.ep > 1) {
    d.per_layer = kind == DispatchKind::ring
                      ? ring_collective_bytes(shape, remat_x_sorted)
                      : alltoall_collective_bytes(shape, expected_alltoall_traffic(shape, dedup), remat_x_sorted);
  }
  const double layers = double(c.model.num_moe_layers());
  d.per_step_bytes = total_bytes(d.per_layer) * layers;
  d.token_bytes_per_step = token_bytes(d.per_layer) * layers;
  d.seconds_per_step = ep_transfer_seconds(c, kind, d.per_step_bytes);
  return d;
}

}  // namespace

const DispatcherBytes& PlanReport::chosen() const {
  for (const DispatcherBytes& d : dispatchers)
    if (d.kind == config.dispatch && d.dedup == config.dedup) return d;
  EPMOE_CHECK(false && "the configured dispatcher is always reported");
  return dispatchers.front();
}

PlanReport make_plan(const PlanConfig& config) {
  config.validate();
  PlanReport r;
  r.config = config;
  r.parameters = count_parameters(config.model);
  r.memory = project_memory(config);
  r.dispatchers = {dispatcher_bytes(config, DispatchKind::ring, false),
                   dispatcher_bytes(config, DispatchKind::alltoall, false),
                   dispatcher_bytes(config, DispatchKind::alltoall, true)};
  r.step = estimate_step_time(config, r.chosen().per_step_bytes);
  char text[256];
  std::snprintf(text, sizeof text,
                "memory: MaxText layout (f32 params + f32 grads + AdamW f32 m,v = 16 B/param, sharded over "
                "fsdp*ep*tp); verdict against %.0f%% of %s HBM (runtime reserve + fragmentation)",
                config.usable_memory_fraction * 100, gb(config.hardware.memory_bytes).c_str());
  r.assumptions.push_back(text);
  r.assumptions.push_back(
      "activations: bf16 unless activation_dtype=f32; x_sorted saved in its transfer format "
      "(fp8 + scale with fp8_tokens on); routed rows sized by token_buffer_factor");
  r.assumptions.push_back(
      "bytes: per device and step, what it sends; uniform routing (K distinct experts "
      "drawn uniformly), dedup hit rate 1 - C(E-E_l,K)/C(E,K)");
  for (std::string& a : step_time_assumptions(config)) r.assumptions.push_back(std::move(a));
  return r;
}

std::string format_report(const PlanReport& r) {
  const PlanConfig& c = r.config;
  const ParallelismSpec& p = c.parallel;
  std::ostringstream out;
  out << "epmoe plan: " << c.model.name << " on " << p.num_devices() << " devices of " << c.hardware.name;
  if (c.hardware.devices_per_chip > 1)
    out << " (" << p.num_devices() / c.hardware.devices_per_chip << " chips, " << c.hardware.devices_per_chip
        << " devices each)";
  out << "\n";
  out << "  parallelism dp=" << p.dp << " fsdp=" << p.fsdp << " ep=" << p.ep << " tp=" << p.tp
      << ", per_device_batch_size=" << fixed(p.per_device_batch_size, 2) << " seq_len=" << p.seq_len << " -> "
      << fixed(p.tokens_per_device(), 0) << " tokens per device\n";
  out << "  dispatch=" << to_string(c.dispatch) << (c.dedup ? " (dedup)" : "")
      << " fp8_tokens=" << token_transfer_name(c.token_transfer)
      << " token_buffer_factor=" << fixed(c.token_buffer_factor, 2) << " token_chunks=" << c.token_chunks
      << " redundant_slots=" << c.redundant_slots
      << (c.redundant_slots > 0 ? (c.replica_costs_priced ? " replica_costs=priced" : " replica_costs=off") : "")
      << "\n";
  out << "  remat:";
  for (const std::string& name : activation_names()) out << " " << name << "=" << to_string(c.choice(name));
  out << "\n";
  out << "  parameters: " << fixed(r.parameters.total(c.model) / 1e9, 1) << " B total, "
      << fixed(r.parameters.active_matmul(c.model) / 1e9, 1) << " B active per token (matmul, incl. LM head)\n\n";

  out << "Memory per device\n";
  std::string category;
  for (const MemoryItem& item : r.memory.device) {
    if (item.category != category) {
      category = item.category;
      out << "  " << category << "\n";
    }
    char line[256];
    std::snprintf(line, sizeof line, "    %-46s %12s   %s\n", item.name.c_str(), gb(item.bytes).c_str(),
                  item.note.c_str());
    out << line;
  }
  char line[256];
  std::snprintf(line, sizeof line, "  %-48s %12s   of %s usable (%s x %.2f)\n", "total on device",
                gb(r.memory.device_total_bytes).c_str(), gb(r.memory.usable_bytes).c_str(),
                gb(c.hardware.memory_bytes).c_str(), c.usable_memory_fraction);
  out << line;
  out << "  verdict: " << (r.memory.fits ? "FITS" : "EXCEEDS") << " ("
      << gb(std::abs(r.memory.usable_bytes - r.memory.device_total_bytes)) << (r.memory.fits ? " headroom" : " short")
      << ")\n";
  for (const MemoryItem& item : r.memory.host) {
    std::snprintf(line, sizeof line, "  host (offloaded) %-31s %12s   %s\n", item.name.c_str(), gb(item.bytes).c_str(),
                  item.note.c_str());
    out << line;
  }

  out << "\nEP bytes per device and step (" << c.model.num_moe_layers() << " MoE layers, R=" << p.ep << ")\n";
  for (const DispatcherBytes& d : r.dispatchers) {
    std::snprintf(line, sizeof line, "  %-16s total %12s  tokens %12s  %8.2f ms on the EP links%s\n", d.label.c_str(),
                  gb(d.per_step_bytes).c_str(), gb(d.token_bytes_per_step).c_str(), d.seconds_per_step * 1e3,
                  (&d == &r.chosen()) ? "   <- configured" : "");
    out << line;
  }
  out << "  per MoE layer, " << r.chosen().label << ":\n";
  for (const CollectiveBytes& collective : r.chosen().per_layer) {
    std::snprintf(line, sizeof line, "    %-40s %14.0f bytes\n", collective.name.c_str(), collective.bytes);
    out << line;
  }
  if (p.ep > 1) {
    const double hit = probability_rank_hit(c.model.num_experts, c.model.num_experts / p.ep, c.model.top_k);
    std::snprintf(line, sizeof line,
                  "  ring vs all-to-all token rows: (R-1)*N_l vs K*(R-1)/R*N_l -> ring %s (R=%lld, K=%lld); "
                  "dedup P(hit)=%.4f saves %.1f%% of all-to-all rows\n",
                  p.ep < c.model.top_k ? "moves fewer" : (p.ep == c.model.top_k ? "ties" : "moves more"),
                  (long long)p.ep, (long long)c.model.top_k, hit,
                  100 * (1 - hit * double(p.ep) / double(c.model.top_k)));
    out << line;
  }

  const StepTime& s = r.step;
  out << "\nStep time estimate (per device)\n";
  std::snprintf(line, sizeof line,
                "  FLOPs: model %.1f TFLOP + recompute %.1f TFLOP -> %.1f ms; MoE data movement %s -> %.1f ms; "
                "compute %.1f ms\n",
                s.model_flops / 1e12, s.recompute_flops / 1e12, s.flop_seconds * 1e3, gb(s.data_movement_bytes).c_str(),
                s.data_movement_seconds * 1e3, s.compute_seconds * 1e3);
  out << line;
  std::snprintf(line, sizeof line, "  EP dispatch %s -> %.1f ms; FSDP %s -> %.1f ms; DP %s -> %.1f ms\n",
                gb(s.ep_bytes).c_str(), s.ep_seconds * 1e3, gb(s.fsdp_bytes).c_str(), s.fsdp_seconds * 1e3,
                gb(s.dp_bytes).c_str(), s.dp_seconds * 1e3);
  out << line;
  std::snprintf(line, sizeof line,
                "  step: %.1f ms overlapped .. %.1f ms serial (%.0f tokens/s/device at the overlapped bound)\n",
                s.overlapped_seconds * 1e3, s.serial_seconds * 1e3, s.tokens_per_second_per_device);
  out << line;
  out << "\nAssumptions\n";
  for (const std::string& a : r.assumptions) out << "  - " << a << "\n";
  return out.str();
}

nlohmann::json report_to_json(const PlanReport& r) {
  const PlanConfig& c = r.config;
  nlohmann::json j;
  j["model"] = c.model.name;
  j["hardware"] = c.hardware.name;
  j["num_devices"] = c.parallel.num_devices();
  j["tokens_per_device"] = c.parallel.tokens_per_device();
  j["parameters_total"] = r.parameters.total(c.model);
  j["parameters_active_matmul"] = r.parameters.active_matmul(c.model);
  nlohmann::json memory;
  for (const MemoryItem& item : r.memory.device)
    memory["device"].push_back(
        {{"category", item.category}, {"name", item.name}, {"bytes", item.bytes}, {"note", item.note}});
  for (const MemoryItem& item : r.memory.host)
    memory["host"].push_back({{"name", item.name}, {"bytes", item.bytes}, {"note", item.note}});
  memory["device_total_bytes"] = r.memory.device_total_bytes;
  memory["usable_bytes"] = r.memory.usable_bytes;
  memory["verdict"] = r.memory.fits ? "FITS" : "EXCEEDS";
  j["memory"] = memory;
  for (const DispatcherBytes& d : r.dispatchers) {
    nlohmann::json dj = {{"dispatcher", d.label},
                         {"per_step_bytes", d.per_step_bytes},
                         {"token_bytes_per_step", d.token_bytes_per_step},
                         {"seconds_per_step", d.seconds_per_step}};
    for (const CollectiveBytes& collective : d.per_layer) dj["per_layer_bytes"][collective.name] = collective.bytes;
    j["dispatchers"].push_back(dj);
  }
  const StepTime& s = r.step;
  j["step_time"] = {{"model_flops", s.model_flops},
                    {"recompute_flops", s.recompute_flops},
                    {"flop_seconds", s.flop_seconds},
                    {"data_movement_bytes", s.data_movement_bytes},
                    {"data_movement_seconds", s.data_movement_seconds},
                    {"compute_seconds", s.compute_seconds},
                    {"ep_bytes", s.ep_bytes},
                    {"ep_seconds", s.ep_seconds},
                    {"fsdp_bytes", s.fsdp_bytes},
                    {"fsdp_seconds", s.fsdp_seconds},
                    {"dp_bytes", s.dp_bytes},
                    {"dp_seconds", s.dp_seconds},
                    {"serial_seconds", s.serial_seconds},
                    {"overlapped_seconds", s.overlapped_seconds}};
  j["assumptions"] = r.assumptions;
  return j;
}

std::string format_sweep_table(const std::string& key, const std::vector<SweepRow>& rows) {
  std::ostringstream out;
  char line[320];
  std::snprintf(line, sizeof line, "%-22s %-15s %10s %10s %10s %-8s %12s %12s %12s %10s\n", key.c_str(), "dispatch",
                "device GB", "usable GB", "x_sorted", "verdict", "ring GB", "a2a GB", "dedup GB", "step ms");
  out << line;
  for (const SweepRow& row : rows) {
    const PlanReport& r = row.report;
    std::snprintf(line, sizeof line, "%-22s %-15s %10.2f %10.2f %10.2f %-8s %12.2f %12.2f %12.2f %10.1f\n",
                  row.value.c_str(), r.chosen().label.c_str(), r.memory.device_total_bytes / 1e9,
                  r.memory.usable_bytes / 1e9, r.memory.item_bytes("x_sorted") / 1e9,
                  r.memory.fits ? "FITS" : "EXCEEDS", r.dispatchers[0].per_step_bytes / 1e9,
                  r.dispatchers[1].per_step_bytes / 1e9, r.dispatchers[2].per_step_bytes / 1e9,
                  r.step.overlapped_seconds * 1e3);
    out << line;
  }
  out << "(GB = 1e9 bytes per device; ring / a2a / dedup = EP bytes per step of each dispatcher; step = overlapped "
         "bound)\n";
  return out.str();
}

}  // namespace epmoe::plan
