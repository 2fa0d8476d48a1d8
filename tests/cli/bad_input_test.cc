// Bad input to every subcommand of epmoe and epmoe-bench (the benchmarks'
// binary, where the build has it), as an adversary would give it: empty values,
// huge and negative numbers, non-numbers, unknown keys, missing files,
// directories, FIFOs and devices as files, zero-sized and wrong-dtype .npy,
// duplicate keys and several documents in YAML, unwritable outputs. One table
// row per case; each runs the built binary once (with a deadline, so a case
// that hangs fails instead of stalling the suite) and asserts the bad-input
// contract: exit code 2, exactly one stderr line "epmoe: error: ..." (or
// "epmoe-bench: error: ...")
// containing every fragment (the key or file and the rule), and nothing
// written (no --out directory, nothing new in the scratch directory).
//
// Inputs, when a case needs them: `epmoe gen-inputs` with N=16, H=8, F=12,
// E=4 (tests/cli/epmoe_cli_fixture.h) into in/, where setups also put the
// broken files. The table is docs/RELIABILITY.md's list of refused inputs.
// Topology: the binary as a subprocess per case; the cases with ranks=R
// run ranks as threads (transport=threads, R in {1, 2, 3}), threads=1 where
// they compute.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "data/npy.h"
#include "data/test_files.h"
#include "epmoe_cli_fixture.h"

namespace epmoe {
namespace {

using testing::EpmoeCli;
using testing::numpy_file_bytes;
using testing::ProcessResult;
using testing::ScratchDir;
using testing::write_bytes;

constexpr auto kDeadline = std::chrono::seconds(60);

// run_program with a deadline, so a regression to a blocking open (a FIFO)
// shows as a failed case.
ProcessResult run_with_deadline(const ScratchDir& scratch, std::vector<std::string> argv) {
  return testing::run_program(scratch, std::move(argv), kDeadline);
}

struct Paths {
  std::filesystem::path in;  // in/ (inputs, and every broken file a setup makes)
};

struct BadInputCase {
  std::string name;           // gtest name: letters, digits, '_'
  bool needs_inputs = false;  // gen-inputs into in/ first
  std::function<void(const Paths&)> setup = {};
  std::vector<std::string> arguments;  // "{in}" and "{out}" are replaced by the paths
  std::vector<std::string> fragments;  // each must be in the error line
  bool epmoe_bench = false;            // run epmoe-bench instead of epmoe
};

std::string npy_f32(const std::string& shape, std::size_t num_elements) {
  return numpy_file_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }",
                          std::string(num_elements * 4, '\0'));
}

std::string npy_i64(const std::string& shape, const std::vector<std::int64_t>& values) {
  std::string data(values.size() * 8, '\0');
  if (!values.empty()) std::memcpy(data.data(), values.data(), data.size());  // data() may be null when empty
  return numpy_file_bytes(1, "{'descr': '<i8', 'fortran_order': False, 'shape': " + shape + ", }", data);
}

std::function<void(const Paths&)> write_file(const std::string& name, const std::string& bytes) {
  return [name, bytes](const Paths& p) {
    std::filesystem::create_directories(p.in);
    write_bytes(p.in / name, bytes);
  };
}

std::function<void(const Paths&)> make_fifo(const std::string& name) {
  return [name](const Paths& p) {
    std::filesystem::create_directories(p.in);
    std::filesystem::remove(p.in / name);
    ASSERT_EQ(::mkfifo((p.in / name).c_str(), 0644), 0);
  };
}

std::function<void(const Paths&)> link_dev_zero(const std::string& name) {
  return [name](const Paths& p) {
    std::filesystem::create_directories(p.in);
    std::filesystem::remove(p.in / name);
    std::filesystem::create_symlink("/dev/zero", p.in / name);
  };
}

std::function<void(const Paths&)> make_directory(const std::string& name) {
  return [name](const Paths& p) {
    std::filesystem::remove(p.in / name);
    std::filesystem::create_directories(p.in / name);
  };
}

std::function<void(const Paths&)> remove_file(const std::string& name) {
  return [name](const Paths& p) { std::filesystem::remove(p.in / name); };
}

// Layer cases: "layer --in {in} --out {out} threads=1" + extra.
std::vector<std::string> layer(std::vector<std::string> extra) {
  std::vector<std::string> arguments = {"layer", "--in", "{in}", "--out", "{out}", "threads=1"};
  arguments.insert(arguments.end(), extra.begin(), extra.end());
  return arguments;
}

std::vector<std::string> gen(std::vector<std::string> extra) {
  std::vector<std::string> arguments = {"gen-inputs", "--out", "{out}"};
  arguments.insert(arguments.end(), extra.begin(), extra.end());
  return arguments;
}

const std::vector<BadInputCase>& bad_input_cases() {
  const std::int64_t big = std::int64_t{1} << 62;
  static const std::vector<BadInputCase> cases = {
      // --- the command line itself ----------------------------------------------
      {"no_subcommand", false, {}, {}, {"subcommand"}},
      {"unknown_subcommand", false, {}, {"lyaer"}, {"unknown subcommand 'lyaer'", "one of train, layer"}},
      {"layer_without_in", false, {}, {"layer", "--out", "{out}"}, {"--in", "required"}},
      {"layer_unknown_option", true, {}, layer({"--bogus"}), {"--bogus"}},
      // --- layer: keys ------------------------------------------------------
      {"layer_unknown_key", true, {}, layer({"top_kk=2"}), {"unknown key 'top_kk'", "did you mean 'top_k'"}},
      {"layer_empty_value", true, {}, layer({"top_k="}), {"top_k=", "expected an integer"}},
      {"layer_not_a_number", true, {}, layer({"top_k=abc"}), {"top_k=abc", "expected an integer"}},
      {"layer_huge_number", true, {}, layer({"top_k=99999999999999999999"}), {"top_k=", "64-bit integer range"}},
      {"layer_beyond_int32", true, {}, layer({"top_k=4294967298"}), {"top_k=4294967298"}},
      {"layer_negative", true, {}, layer({"top_k=-1"}), {"top_k=-1", "must be >= 1"}},
      {"layer_top_k_above_experts", true, {}, layer({"top_k=5"}), {"top_k", "5"}},
      {"layer_no_equals", true, {}, layer({"top_k"}), {"'top_k'", "expected key=value"}},
      {"layer_empty_key", true, {}, layer({"=3"}), {"'=3'", "expected key=value"}},
      {"layer_ranks_not_dividing_experts", true, {}, layer({"ranks=3"}), {"ranks=3", "must divide num_experts"}},
      {"layer_threads_zero", true, {}, layer({"threads=0"}), {"threads=0", "must be >= 1"}},
      {"layer_nan_capacity", true, {}, layer({"capacity_factor=nan"}), {"capacity_factor=nan", "finite"}},
      {"layer_inf_scaling", true, {}, layer({"routed_scaling_factor=inf"}), {"routed_scaling_factor=inf"}},
      {"layer_bad_choice", true, {}, layer({"router=best"}), {"router=best", "expected one of"}},
      {"layer_bad_wire_dtype", true, {}, layer({"wire_dtype=fp16"}), {"wire_dtype=fp16", "expected one of"}},
      {"layer_bad_bool", true, {}, layer({"dedup=yes"}), {"dedup=yes", "expected true, false"}},
      {"layer_mpi_without_mpirun", true, {}, layer({"transport=mpi"}), {"transport=mpi", "mpirun"}},
      {"layer_dedup_with_ring", true, {}, layer({"ranks=2", "dispatch=ring", "dedup=true"}), {"dedup=true"}},
      {"layer_timeout_zero", true, {}, layer({"comm_timeout_ms=0"}), {"comm_timeout_ms=0"}},
      {"layer_timeout_huge",
       true,
       {},
       layer({"ranks=2", "comm_timeout_ms=9223372036854775807"}),
       {"comm_timeout_ms=9223372036854775807", "must be <= 86400000"}},
      {"layer_threads_huge", true, {}, layer({"threads=2000000"}), {"threads=2000000", "must be <= 1024"}},
      {"layer_token_chunks_huge", true, {}, layer({"token_chunks=65"}), {"token_chunks=65", "<= 64"}},
      // The modelled clock's keys (run/modelled_time_settings.h).
      {"layer_bad_clock", true, {}, layer({"clock=virtual"}), {"clock=virtual", "expected one of"}},
      {"layer_hardware_without_modelled_clock",
       true,
       {},
       layer({"hardware=h100"}),
       {"hardware=h100", "clock=modelled only"}},
      {"layer_unknown_hardware",
       true,
       {},
       layer({"clock=modelled", "hardware=h1000"}),
       {"hardware=h1000", "neither a hardware preset"}},
      {"layer_modelled_on_mpi",
       true,
       {},
       layer({"clock=modelled", "transport=mpi"}),
       {"clock=modelled", "transport=threads"}},
      {"layer_measured_replica_costs_on_the_modelled_clock",
       true,
       {},
       layer({"clock=modelled", "balance=dynamic", "redundant_slots=1", "replica_costs=measured"}),
       {"replica_costs=measured", "clock=wall"}},
      {"layer_compute_efficiency_zero",
       true,
       {},
       layer({"clock=modelled", "compute_efficiency=0"}),
       {"compute_efficiency=0", "must be > 0"}},
      {"layer_compute_efficiency_above_one",
       true,
       {},
       layer({"clock=modelled", "compute_efficiency=1.5"}),
       {"compute_efficiency=1.5", "<= 1"}},
      // Issue 28 N8: values whose modelled times leave the clock's range
      // (int64 picoseconds, ~9.2e6 s) are refused when parsed, naming the
      // key and its range; what passes and still leaves it (a huge step at
      // the smallest rates) is refused by the clock, naming what overflowed.
      {"layer_modelled_latency_beyond_a_second",
       true,
       {},
       layer({"clock=modelled", "link_latency_us=1e15"}),
       {"link_latency_us = 1e+15", "[0, 1e+06]"}},
      {"layer_emulated_latency_beyond_a_second",
       true,
       {},
       layer({"link_bandwidth_gbps=10", "link_latency_us=1e18"}),
       {"link_latency_us = 1e+18", "[0, 1e+06]"}},
      {"layer_modelled_bandwidth_below_1kBps",
       true,
       {},
       layer({"clock=modelled", "link_bandwidth_gbps=1e-30"}),
       {"link_bandwidth_gbps = 1e-30", ">= 1e-06"}},
      {"layer_compute_efficiency_below_a_millionth",
       true,
       {},
       layer({"clock=modelled", "compute_efficiency=1e-300"}),
       {"compute_efficiency = 1e-300", "[1e-06, 1]"}},
      {"layer_compute_scale_above_1e6",
       true,
       {},
       layer({"clock=modelled", "compute_time=measured", "compute_scale=1e300"}),
       {"compute_scale = 1e+300", "(0, 1e+06]"}},
      {"layer_hardware_file_tiny_rate",
       true,
       write_file("tiny.yaml",
                  "memory_gb: 80\nmemory_gb_per_s: 3350\npeak_bf16_tflops: 1e-30\npeak_fp8_tflops: 1\n"
                  "interconnect: switched\nscale_up_devices: 8\nlink_gb_per_s: 450\nscale_out_gb_per_s: 50\n"),
       layer({"clock=modelled", "hardware={in}/tiny.yaml"}),
       {"tiny.yaml:3", "peak_bf16_tflops=1e-30", ">= 1e-06"}},
      {"layer_modelled_step_beyond_the_clock",
       true,
       [](const Paths& p) {
         // The smallest rates the keys allow (1 FLOP/s with compute_efficiency
         // 1e-6) and 8192 tokens: ~2.8e7 FLOP, past 9.2e6 s.
         write_file("slowest.yaml",
                    "memory_gb: 80\nmemory_gb_per_s: 0.001\npeak_bf16_tflops: 1e-6\npeak_fp8_tflops: 1e-6\n"
                    "interconnect: switched\nscale_up_devices: 8\nlink_gb_per_s: 1e-6\nscale_out_gb_per_s: 1e-6\n")(p);
         write_file("x.npy", npy_f32("(8192, 8)", 8192 * 8))(p);
         write_file("dy.npy", npy_f32("(8192, 8)", 8192 * 8))(p);
       },
       layer({"clock=modelled", "hardware={in}/slowest.yaml", "compute_efficiency=1e-6", "ranks=2"}),
       {"clock=modelled: ", "beyond the modelled clock's range"}},
      {"layer_modelled_link_bandwidth_zero",
       true,
       {},
       layer({"clock=modelled", "link_bandwidth_gbps=0"}),
       {"link_bandwidth_gbps=0", "overrides the hardware"}},
      {"layer_trace_on_mpi",
       true,
       {},
       layer({"transport=mpi", "trace_file=/tmp/t.json"}),
       {"trace_file=/tmp/t.json", "transport=threads only"}},
      // trace_file is checked with --out, before any compute: before, the run
      // wrote all of --out and then failed (and a directory left PATH.tmp).
      {"layer_trace_file_unwritable",
       true,
       {},
       layer({"trace_file=/proc/epmoe-no-such/t.json"}),
       {"trace_file=/proc/epmoe-no-such/t.json", "cannot create files in /proc"}},
      {"layer_trace_file_is_a_directory",
       true,
       make_directory("trace"),
       layer({"trace_file={in}/trace"}),
       {"trace_file=", "/trace: is a directory; name a file"}},
      // --- layer: fault_injection (a test hook) -----------------------------
      {"layer_fault_injection_malformed", true, {}, layer({"fault_injection=banana"}), {"fault_injection", "banana"}},
      {"layer_fault_injection_empty", true, {}, layer({"fault_injection="}), {"fault_injection", "empty"}},
      {"layer_fault_injection_bad_action",
       true,
       {},
       layer({"fault_injection=0:dispatch:explode"}),
       {"fault_injection", "ACTION"}},
      {"layer_fault_injection_bad_nth",
       true,
       {},
       layer({"fault_injection=0:dispatch:throw:0"}),
       {"fault_injection", "NTH"}},
      {"layer_fault_injection_rank_out_of_range",
       true,
       {},
       layer({"ranks=2", "fault_injection=7:dispatch"}),
       {"fault_injection=7:dispatch", "ranks=2"}},
      {"layer_fault_injection_stop_with_one_rank",
       true,
       {},
       layer({"ranks=1", "fault_injection=0:dispatch:stop"}),
       {"fault_injection=0:dispatch:stop", "stop needs ranks >= 2"}},
      // --- layer: --out -----------------------------------------------------
      {"layer_out_empty", true, {}, {"layer", "--in", "{in}", "--out", "", "threads=1"}, {"--out", "empty"}},
      {"layer_out_is_a_file",
       true,
       {},
       {"layer", "--in", "{in}", "--out", "{in}/x.npy", "threads=1"},
       {"x.npy", "not a directory"}},
      {"layer_out_below_a_file",
       true,
       {},
       {"layer", "--in", "{in}", "--out", "{in}/x.npy/out", "threads=1"},
       {"x.npy", "not a directory"}},
      {"layer_out_unwritable",
       true,
       {},
       {"layer", "--in", "{in}", "--out", "/proc/epmoe-no-such/out", "threads=1"},
       {"/proc/epmoe-no-such/out", "cannot create files in /proc"}},
      // --- layer: input files -----------------------------------------------
      {"layer_in_missing",
       false,
       {},
       {"layer", "--in", "{in}/missing", "--out", "{out}"},
       {"--in", "no such directory"}},
      {"layer_in_empty", false, {}, {"layer", "--in", "", "--out", "{out}"}, {"--in ''", "empty"}},
      {"layer_x_missing", true, remove_file("x.npy"), layer({}), {"x.npy", "no such file"}},
      {"layer_x_directory", true, make_directory("x.npy"), layer({}), {"x.npy", "is a directory"}},
      {"layer_x_fifo", true, make_fifo("x.npy"), layer({}), {"x.npy", "not a regular file"}},
      {"layer_x_dev_zero", true, link_dev_zero("x.npy"), layer({}), {"x.npy", "not a regular file"}},
      {"layer_x_zero_bytes", true, write_file("x.npy", ""), layer({}), {"x.npy", "not an .npy file"}},
      {"layer_x_float64",
       true,
       write_file("x.npy", numpy_file_bytes(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (16, 8), }",
                                            std::string(16 * 8 * 8, '\0'))),
       layer({}),
       {"x.npy", "'<f8'", "float32"}},
      {"layer_x_truncated", true, write_file("x.npy", npy_f32("(16, 8)", 100)), layer({}), {"x.npy", "truncated"}},
      {"layer_x_huge_shape",
       true,
       write_file("x.npy", npy_f32("(4611686018427387904, 8)", 0)),
       layer({}),
       {"x.npy", "overflows"}},
      {"layer_gate_wrong_shape",
       true,
       write_file("gate.npy", npy_f32("(9, 4)", 36)),
       layer({}),
       {"gate.npy", "shape [9, 4]"}},
      {"layer_wo_int64", true, write_file("wo.npy", npy_i64("(1,)", {1})), layer({}), {"wo.npy", "'<i8'"}},
      {"layer_dy_fifo", true, make_fifo("dy.npy"), layer({}), {"dy.npy", "not a regular file"}},
      {"layer_bias_unused", true, write_file("bias.npy", npy_f32("(4,)", 4)), layer({}), {"bias.npy", "router"}},
      // --- layer: --config --------------------------------------------------
      {"layer_config_missing", true, {}, layer({"--config", "{in}/none.yaml"}), {"none.yaml", "no such file"}},
      {"layer_config_empty_path", true, {}, layer({"--config", ""}), {"--config", "empty"}},
      {"layer_config_directory", true, {}, layer({"--config", "{in}"}), {"is a directory"}},
      {"layer_config_fifo",
       true,
       make_fifo("c.yaml"),
       layer({"--config", "{in}/c.yaml"}),
       {"c.yaml", "not a regular file"}},
      {"layer_config_dev_zero",
       true,
       link_dev_zero("c.yaml"),
       layer({"--config", "{in}/c.yaml"}),
       {"c.yaml", "not a regular file"}},
      {"layer_config_duplicate_key",
       true,
       write_file("c.yaml", "top_k: 2\nrouter: random\ntop_k: 1\n"),
       layer({"--config", "{in}/c.yaml"}),
       {"c.yaml:3", "'top_k' is set twice", "c.yaml:1"}},
      {"layer_config_duplicate_nested_and_dotted",
       true,
       write_file("c.yaml", "remat_policy: custom\nremat:\n  x_sorted: save\nremat.x_sorted: remat\n"),
       layer({"--config", "{in}/c.yaml"}),
       {"c.yaml:4", "'remat.x_sorted' is set twice"}},
      {"layer_config_two_documents",
       true,
       write_file("c.yaml", "top_k: 2\n---\ntop_k: 1\n"),
       layer({"--config", "{in}/c.yaml"}),
       {"c.yaml", "2 YAML documents"}},
      {"layer_config_malformed",
       true,
       write_file("c.yaml", "top_k: [2\n"),
       layer({"--config", "{in}/c.yaml"}),
       {"c.yaml", "malformed YAML"}},
      {"layer_config_list_value",
       true,
       write_file("c.yaml", "top_k: [1, 2]\n"),
       layer({"--config", "{in}/c.yaml"}),
       {"c.yaml:1", "'top_k' holds a list"}},
      {"layer_config_bad_value",
       true,
       write_file("c.yaml", "\ntop_k: two\n"),
       layer({"--config", "{in}/c.yaml"}),
       {"c.yaml:2", "top_k=two"}},
      // --- gen-inputs ---------------------------------------------------------
      {"gen_negative_tokens", false, {}, gen({"num_tokens=-1"}), {"num_tokens=-1", "must be >= 0"}},
      {"gen_zero_hidden", false, {}, gen({"hidden=0"}), {"hidden=0", "must be >= 1"}},
      {"gen_not_a_number", false, {}, gen({"ffn=12x"}), {"ffn=12x", "expected an integer"}},
      {"gen_empty_value", false, {}, gen({"num_experts="}), {"num_experts=", "expected an integer"}},
      {"gen_unknown_key", false, {}, gen({"seeds=1"}), {"unknown key 'seeds'", "did you mean 'seed'"}},
      {"gen_bad_bool", false, {}, gen({"with_dy=maybe"}), {"with_dy=maybe"}},
      {"gen_zero_scale", false, {}, gen({"scale=0"}), {"scale=0", "must be > 0"}},
      {"gen_sizes_overflow",
       false,
       {},
       gen({"num_tokens=9223372036854775807"}),
       {"num_tokens=9223372036854775807", "overflow"}},
      {"gen_sizes_beyond_memory",
       false,
       {},
       gen({"num_experts=" + std::to_string(big >> 40), "hidden=4096", "ffn=4096"}),
       {"num_experts=", "more than this machine's memory"}},
      {"gen_out_empty", false, {}, {"gen-inputs", "--out", ""}, {"--out", "empty"}},
      {"gen_out_unwritable",
       false,
       {},
       {"gen-inputs", "--out", "/proc/epmoe-no-such/out"},
       {"/proc/epmoe-no-such/out", "cannot create files in /proc"}},
      {"gen_out_is_a_file", false, write_file("f", "x"), {"gen-inputs", "--out", "{in}/f"}, {"f", "not a directory"}},
      // --- plan ---------------------------------------------------------------
      {"plan_device_count_overflow",
       false,
       {},
       {"plan", "fsdp=9223372036854775807"},
       {"fsdp=9223372036854775807", "overflows"}},
      {"plan_device_count_overflow_dp",
       false,
       {},
       {"plan", "dp=4611686018427387904", "fsdp=2", "ep=8"},
       {"overflows", "dp*fsdp*ep*tp"}},
      {"plan_tokens_beyond_2_53",
       false,
       {},
       {"plan", "per_device_batch_size=1e300"},
       {"per_device_batch_size=1e+300", "2^53"}},
      {"plan_ep_zero", false, {}, {"plan", "ep=0"}, {"ep=0", "must be >= 1"}},
      {"plan_ep_not_dividing", false, {}, {"plan", "ep=7"}, {"ep=7", "must divide"}},
      {"plan_not_a_number", false, {}, {"plan", "seq_len=abc"}, {"seq_len=abc", "expected an integer"}},
      {"plan_unknown_key", false, {}, {"plan", "fsdpp=2"}, {"unknown key 'fsdpp'"}},
      {"plan_empty_value", false, {}, {"plan", "tp="}, {"tp=", "expected an integer"}},
      {"plan_sweep_unknown_key", false, {}, {"plan", "sweep=bogus:1,2"}, {"sweep=bogus:1,2", "not a plan key"}},
      {"plan_sweep_empty_item", false, {}, {"plan", "sweep=ep:8,,16"}, {"sweep=ep:8,,16", "empty value"}},
      {"plan_sweep_bad_value", false, {}, {"plan", "sweep=ep:8,x"}, {"ep=x", "expected an integer"}},
      {"plan_model_missing", false, {}, {"plan", "model={in}/none.yaml"}, {"none.yaml", "neither a model preset"}},
      {"plan_model_fifo", false, make_fifo("m.yaml"), {"plan", "model={in}/m.yaml"}, {"m.yaml", "not a regular file"}},
      {"plan_hardware_dev_zero",
       false,
       link_dev_zero("h.yaml"),
       {"plan", "hardware={in}/h.yaml"},
       {"h.yaml", "not a regular file"}},
      {"plan_hardware_two_documents",
       false,
       write_file("h.yaml", "name: a\n---\nname: b\n"),
       {"plan", "hardware={in}/h.yaml"},
       {"h.yaml", "2 YAML documents"}},
      {"plan_config_duplicate_key",
       false,
       write_file("p.yaml", "ep: 8\nep: 16\n"),
       {"plan", "--config", "{in}/p.yaml"},
       {"p.yaml:2", "'ep' is set twice"}},
      {"plan_config_fifo",
       false,
       make_fifo("p.yaml"),
       {"plan", "--config", "{in}/p.yaml"},
       {"p.yaml", "not a regular file"}},
      {"plan_config_empty_path", false, {}, {"plan", "--config", ""}, {"--config", "empty"}},
      // --- balance ------------------------------------------------------------
      {"balance_loads_missing", false, {}, {"balance", "--loads", "{in}/none.npy"}, {"none.npy", "no such file"}},
      {"balance_loads_fifo",
       false,
       make_fifo("l.npy"),
       {"balance", "--loads", "{in}/l.npy"},
       {"l.npy", "not a regular file"}},
      {"balance_loads_dev_zero",
       false,
       link_dev_zero("l.npy"),
       {"balance", "--loads", "{in}/l.npy"},
       {"l.npy", "not a regular file"}},
      {"balance_loads_directory",
       false,
       make_directory("l.npy"),
       {"balance", "--loads", "{in}/l.npy"},
       {"l.npy", "is a directory"}},
      {"balance_loads_zero_bytes",
       false,
       write_file("l.npy", ""),
       {"balance", "--loads", "{in}/l.npy"},
       {"l.npy", "not an .npy file"}},
      {"balance_loads_float32",
       false,
       write_file("l.npy", npy_f32("(2, 4)", 8)),
       {"balance", "--loads", "{in}/l.npy"},
       {"l.npy", "'<f4'", "int64"}},
      {"balance_loads_negative",
       false,
       write_file("l.npy", npy_i64("(2, 4)", {1, 2, 3, 4, 5, -6, 7, 8})),
       {"balance", "--loads", "{in}/l.npy", "ranks=2", "slots=0"},
       {"l.npy", "loads[1, 1] = -6", ">= 0"}},
      {"balance_loads_sum_overflows",
       false,
       write_file("l.npy", npy_i64("(2, 4)", {big, big, big, big, 1, 1, 1, 1})),
       {"balance", "--loads", "{in}/l.npy", "ranks=2", "slots=0"},
       {"l.npy", "overflows", "loads[0, 1]"}},
      {"balance_loads_no_steps",
       false,
       write_file("l.npy", npy_i64("(0, 4)", {})),
       {"balance", "--loads", "{in}/l.npy"},
       {"l.npy", "no steps"}},
      {"balance_loads_one_dimensional",
       false,
       write_file("l.npy", npy_i64("(4,)", {1, 2, 3, 4})),
       {"balance", "--loads", "{in}/l.npy"},
       {"l.npy", "shape [4]", "[steps, E]"}},
      {"balance_ranks_not_dividing",
       false,
       write_file("l.npy", npy_i64("(1, 4)", {1, 2, 3, 4})),
       {"balance", "--loads", "{in}/l.npy", "ranks=3"},
       {"ranks=3"}},
      {"balance_generate_key_with_loads",
       false,
       write_file("l.npy", npy_i64("(1, 4)", {1, 2, 3, 4})),
       {"balance", "--loads", "{in}/l.npy", "experts=4"},
       {"unknown key 'experts'"}},
      // --loads of a metrics.jsonl (epmoe train's expert_counts)
      {"balance_metrics_not_json",
       false,
       write_file("m.jsonl", "{\"step\": 1, \"expert_counts\": [[1, 2, 3, 4]]}\n{\"step\": 2, \"exp"),
       {"balance", "--loads", "{in}/m.jsonl", "ranks=2"},
       {"m.jsonl:2:", "not JSON"}},
      {"balance_metrics_no_step",
       false,
       write_file("m.jsonl", "{\"expert_counts\": [[1, 2, 3, 4]]}\n"),
       {"balance", "--loads", "{in}/m.jsonl", "ranks=2"},
       {"m.jsonl:1:", "\"step\""}},
      {"balance_metrics_no_expert_counts",
       false,
       write_file("m.jsonl", "{\"step\": 1, \"loss\": 4.2}\n"),
       {"balance", "--loads", "{in}/m.jsonl", "ranks=2"},
       {"m.jsonl:1:", "no \"expert_counts\"", "older epmoe"}},
      {"balance_metrics_layers_differ",
       false,
       write_file("m.jsonl",
                  "{\"step\": 1, \"expert_counts\": [[1, 2, 3, 4], [4, 3, 2, 1]]}\n"
                  "{\"step\": 2, \"expert_counts\": [[1, 2, 3, 4]]}\n"),
       {"balance", "--loads", "{in}/m.jsonl", "ranks=2"},
       {"m.jsonl:2:", "1 layers", "first line 2"}},
      {"balance_metrics_experts_differ",
       false,
       write_file("m.jsonl",
                  "{\"step\": 1, \"expert_counts\": [[1, 2, 3, 4]]}\n"
                  "{\"step\": 2, \"expert_counts\": [[1, 2, 3]]}\n"),
       {"balance", "--loads", "{in}/m.jsonl", "ranks=2"},
       {"m.jsonl:2:", "3 experts", "first line 4"}},
      {"balance_metrics_negative",
       false,
       write_file("m.jsonl", "{\"step\": 1, \"expert_counts\": [[1, 2, -1, 4]]}\n"),
       {"balance", "--loads", "{in}/m.jsonl", "ranks=2"},
       {"m.jsonl:1:", "[0][2] = -1", ">= 0"}},
      {"balance_metrics_layer_out_of_range",
       false,
       write_file("m.jsonl", "{\"step\": 1, \"expert_counts\": [[1, 2, 3, 4]]}\n"),
       {"balance", "--loads", "{in}/m.jsonl", "ranks=2", "layer=1"},
       {"layer=1", "m.jsonl:1", "1 layers"}},
      {"balance_metrics_layer_not_a_number",
       false,
       write_file("m.jsonl", "{\"step\": 1, \"expert_counts\": [[1, 2, 3, 4]]}\n"),
       {"balance", "--loads", "{in}/m.jsonl", "ranks=2", "layer=first"},
       {"layer=first", "layer index"}},
      {"balance_metrics_empty",
       false,
       write_file("m.jsonl", ""),
       {"balance", "--loads", "{in}/m.jsonl"},
       {"m.jsonl", "empty"}},
      {"balance_metrics_fifo",
       false,
       make_fifo("m.jsonl"),
       {"balance", "--loads", "{in}/m.jsonl"},
       {"m.jsonl", "not a regular file"}},
      {"balance_layer_with_npy",
       false,
       write_file("l.npy", npy_i64("(1, 4)", {1, 2, 3, 4})),
       {"balance", "--loads", "{in}/l.npy", "ranks=2", "layer=0"},
       {"layer=0", "only a metrics.jsonl"}},
      {"balance_both_modes",
       false,
       {},
       {"balance", "--loads", "{in}/a.npy", "--generate", "{in}/b.npy"},
       {"exactly one of --loads"}},
      {"balance_no_mode", false, {}, {"balance"}, {"exactly one of --loads"}},
      {"balance_generate_not_a_number",
       false,
       {},
       {"balance", "--generate", "{in}/g.npy", "experts=abc"},
       {"experts=abc", "expected an integer"}},
      {"balance_generate_beyond_memory",
       false,
       write_file("keep", ""),
       {"balance", "--generate", "{in}/g.npy", "steps=2000000000"},
       {"steps=2000000000 experts=64", "more than this machine's memory"}},
      {"balance_generate_pairs_overflow",
       false,
       write_file("keep", ""),
       {"balance", "--generate", "{in}/g.npy", "tokens_per_rank=9223372036854775807"},
       {"tokens_per_rank=9223372036854775807", "overflow"}},
      {"balance_generate_unwritable",
       false,
       {},
       {"balance", "--generate", "/proc/epmoe-no-such/g.npy"},
       {"/proc/epmoe-no-such/g.npy", "does not exist"}},
      {"balance_generate_into_directory",
       false,
       make_directory("d"),
       {"balance", "--generate", "{in}/d"},
       {"d", "not a regular file"}},
      // CLI11 gives an option's value the next word, an option or not.
      {"balance_generate_option_as_file",
       false,
       {},
       {"balance", "--generate", "--help"},
       {"--generate", "'--help'", "expects a file name"}},
      // --- bench: the benchmarks are a binary of their own ------------------------
      {"bench_moved_to_epmoe_bench", false, {}, {"bench", "layer"}, {"moved to the epmoe-bench binary"}},
      // --- train (keys on the command line) -------------------------------------
      {"train_not_a_number", false, {}, {"train", "top_k=abc"}, {"top_k=abc", "expected an integer"}},
      {"train_unknown_key", false, {}, {"train", "stepz=3"}, {"unknown key 'stepz'"}},
      {"train_ranks_zero", false, {}, {"train", "ranks=0"}, {"ranks=0", "must be >= 1"}},
      {"train_fault_injection_malformed", false, {}, {"train", "ranks=1", "fault_injection=0"}, {"fault_injection"}},
      {"train_fault_injection_rank_out_of_range",
       false,
       {},
       {"train", "ranks=2", "fault_injection=2:dispatch"},
       {"fault_injection=2:dispatch", "ranks=2"}},
      // Every output path before any step: before, an unwritable trace_file
      // let the run train every step and commit its checkpoint, then exit 2.
      // Nothing under {out} afterwards: no metrics line, no checkpoint.
      {"train_trace_file_unwritable_before_any_step",
       false,
       {},
       {"train", "ranks=1", "steps=2", "progress=off", "metrics_file={out}/metrics.jsonl",
        "checkpoint_dir={out}/checkpoints", "trace_file=/proc/epmoe-no-such/t.json"},
       {"trace_file=/proc/epmoe-no-such/t.json", "cannot create files in /proc"}},
      {"train_trace_file_is_a_directory",
       false,
       make_directory("trace"),
       {"train", "ranks=1", "steps=2", "progress=off", "metrics_file={out}/metrics.jsonl",
        "checkpoint_dir={out}/checkpoints", "trace_file={in}/trace"},
       {"trace_file=", "/trace: is a directory; name a file"}},
      {"train_metrics_file_unwritable",
       false,
       {},
       {"train", "ranks=1", "steps=2", "checkpoint_dir={out}/checkpoints", "metrics_file=/proc/epmoe-no-such/m.jsonl"},
       {"metrics_file=/proc/epmoe-no-such/m.jsonl", "cannot create files in /proc"}},
      {"train_config_fifo",
       false,
       make_fifo("t.yaml"),
       {"train", "--config", "{in}/t.yaml"},
       {"t.yaml", "not a regular file"}},
      {"train_config_duplicate_key",
       false,
       write_file("t.yaml", "steps: 2\nsteps: 3\n"),
       {"train", "--config", "{in}/t.yaml"},
       {"t.yaml:2", "'steps' is set twice"}},
      {"train_config_empty_path", false, {}, {"train", "--config", ""}, {"--config", "empty"}},
#ifdef EPMOE_BENCH_BINARY
      // --- epmoe-bench -------------------------------------------------------------
      {"bench_unknown_benchmark", false, {}, {"gemm"}, {"unknown benchmark 'gemm'", "collectives, layer"}, true},
      {"bench_unknown_part", false, {}, {"collectives", "fast"}, {"unknown part 'fast'"}, true},
      {"bench_two_parts", false, {}, {"layer", "remat", "replicas"}, {"two parts"}, true},
      {"bench_layer_not_a_number", false, {}, {"layer", "ranks=abc"}, {"ranks=abc", "expected an integer"}, true},
      {"bench_layer_unknown_key",
       false,
       {},
       {"layer", "rnaks=4"},
       {"unknown key 'rnaks'", "'ranks'", "(epmoe-bench layer --help lists every key)"},
       true},
      {"bench_layer_no_key", false, {}, {"layer", "=4"}, {"'=4'", "epmoe-bench layer --help"}, true},
      {"bench_layer_negative_seconds", false, {}, {"layer", "min_seconds=-1"}, {"min_seconds=-1"}, true},
      {"bench_layer_verify_two", false, {}, {"layer", "verify=2"}, {"verify=2", "<= 1"}, true},
      {"bench_layer_slots_bad_item", false, {}, {"layer", "replicas", "slots=1,x"}, {"slots=1,x", "'x'"}, true},
      // The hook belongs to one run's ranks (core/fault_injection.h); the
      // benchmarks' runs install none, so the key is not theirs.
      {"bench_layer_fault_injection_is_not_a_bench_key",
       false,
       {},
       {"layer", "fault_injection=0:dispatch"},
       {"unknown key 'fault_injection'"},
       true},
      {"bench_collectives_zero_chunk", false, {}, {"collectives", "chunks=0"}, {"chunks=0", "item 0"}, true},
      {"bench_collectives_huge_chunk", false, {}, {"collectives", "chunks=99999999M"}, {"chunks=99999999M"}, true},
      {"bench_collectives_bad_ranks", false, {}, {"collectives", "ranks=a,b"}, {"ranks=a,b", "'a'"}, true},
      {"bench_collectives_empty_value",
       false,
       {},
       {"collectives", "bandwidth_gb_s="},
       {"bandwidth_gb_s=", "expected a finite number"},
       true},
      {"bench_collectives_runs_inverted",
       false,
       {},
       {"collectives", "min_runs=9", "max_runs=3"},
       {"min_runs=9", "max_runs=3"},
       true},
#endif
  };
  return cases;
}

// Every path below `dir` (empty when it does not exist).
std::set<std::string> tree(const std::filesystem::path& dir) {
  std::set<std::string> paths;
  if (!std::filesystem::exists(dir)) return paths;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    paths.insert(std::filesystem::relative(entry.path(), dir).string());
  }
  return paths;
}

// gtest prints a failing case's parameter: its name, not its bytes.
void PrintTo(const BadInputCase& c, std::ostream* os) { *os << c.name; }

class BadInput : public EpmoeCli, public ::testing::WithParamInterface<BadInputCase> {};

TEST_P(BadInput, ExitsTwoWithOneLineNamingTheCauseAndWritesNothing) {
  const BadInputCase& c = GetParam();
  if (c.needs_inputs) generate_inputs();
  if (c.setup) c.setup(Paths{in_dir()});
  if (::testing::Test::HasFatalFailure()) return;
#ifdef EPMOE_BENCH_BINARY
  std::vector<std::string> argv = {c.epmoe_bench ? EPMOE_BENCH_BINARY : EPMOE_BINARY};
#else
  std::vector<std::string> argv = {EPMOE_BINARY};
#endif
  const std::string program = c.epmoe_bench ? "epmoe-bench" : "epmoe";
  for (std::string argument : c.arguments) {
    for (const auto& [placeholder, path] : {std::pair{std::string("{in}"), in_dir()}, {"{out}", out_dir()}}) {
      for (std::size_t at; (at = argument.find(placeholder)) != std::string::npos;) {
        argument.replace(at, placeholder.size(), path.string());
      }
    }
    argv.push_back(argument);
  }
  const std::set<std::string> in_before = tree(in_dir());
  const ProcessResult result = run_with_deadline(scratch_, argv);
  // In --gtest_output=xml: the table of refused inputs and their messages
  // (scripts/bad_input_table.py turns it into docs/RELIABILITY.md's table).
  std::string command = program;
  for (const std::string& argument : c.arguments) command += " " + (argument.empty() ? "''" : argument);
  RecordProperty("command", command);
  RecordProperty("in_dir", in_dir().string());
  RecordProperty("out_dir", out_dir().string());
  RecordProperty("stderr", result.stderr_text.substr(0, result.stderr_text.find('\n')));
  expect_rejected(result, {}, program);  // exit 2, one line, no --out, nothing beside in/
  EXPECT_EQ(tree(in_dir()), in_before) << "the run changed in/";
  for (const std::string& fragment : c.fragments) {
    EXPECT_NE(result.stderr_text.find(fragment), std::string::npos)
        << "stderr: " << result.stderr_text << "missing: " << fragment;
  }
  EXPECT_EQ(result.stdout_text, "");
}

INSTANTIATE_TEST_SUITE_P(EveryCommand, BadInput, ::testing::ValuesIn(bad_input_cases()),
                         [](const ::testing::TestParamInfo<BadInputCase>& info) { return info.param.name; });

}  // namespace
}  // namespace epmoe
