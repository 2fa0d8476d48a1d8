// epmoe train: trains the tiny MoE LM (model/moe_lm.h) on synthetic data,
// expert-parallel over ranks=R threads or `mpirun -np R ... transport=mpi`.
// Every key is validated, and the checkpoint directory and metrics file are
// checked, before any rank starts; then each rank runs model/trainer.h and
// rank 0 writes the metrics and the progress line.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/training_output.h"
#include "core/error.h"
#include "data/checkpoint_store.h"
#include "data/output_paths.h"
#include "ep/ep_config.h"
#include "model/trainer.h"
#include "run/config_keys.h"
#include "run/layer_key_groups.h"
#include "run/modelled_time_settings.h"
#include "run/mpi_environment.h"
#include "run/rank_launcher.h"
#include "run/run_faults.h"
#include "run/train_key_groups.h"
#include "run/yaml_overrides.h"

namespace epmoe::cli {

using run::command_assignments;
using run::ConfigValues;
using run::data_keys;
using run::expert_parallel_keys;
using run::expert_parallel_settings_from;
using run::ExpertParallelSettings;
using run::fault_injector_from;
using run::FaultSpecSource;
using run::KeyGroup;
using run::KeyRegistry;
using run::KeySpec;
using run::KeyType;
using run::launch_ranks;
using run::model_keys;
using run::modelled_time_keys;
using run::moe_layer_keys;
using run::moe_lm_config_from;
using run::mpi_launch_from_environment;
using run::MpiLaunch;
using run::non_empty_config_path;
using run::runtime_keys;
using run::train_output_keys;
using run::trainer_config_from;
using run::training_keys;
using run::TransportKind;
namespace {

constexpr char kTrainCommand[] = "train";

// The default run is the README's main command: four ranks on threads.
// Replicas are on by default (balance=dynamic redundant_slots=2, priced,
// replica_planning=forecast): a step looks for them only when the previous
// step's counts, which the trainer gathers anyway, say a plan pays, so a run
// whose replicas never pay costs what balance=off costs (docs/BALANCE.md,
// "The trainer's default"). The trainer alone has replica_planning: it
// hands each layer those counts.
KeyGroup train_expert_parallel_keys() {
  KeyGroup group = expert_parallel_keys();
  for (KeySpec& key : group.keys) {
    if (key.name == "ranks") key.default_value = "4";
    if (key.name == "balance") {
      key.default_value = "dynamic";
      key.help += " (epmoe train: dynamic, or off on one rank or with capacity_factor > 0)";
    }
    if (key.name == "redundant_slots") key.default_value = "2";
  }
  group.keys.push_back(
      {.name = "replica_planning",
       .type = KeyType::choice,
       .default_value = to_string(ReplicaPlanning::forecast),
       .help = "balance=dynamic: forecast = a step looks for replicas (counts round, exact plan) only when a priced "
               "plan on the previous step's counts, which the trainer gathers anyway, places some, else every pair "
               "goes home at no cost; exact = every step looks (refused plans skip 1, 2, 4 .. 16 steps)",
       .choices = {to_string(ReplicaPlanning::exact), to_string(ReplicaPlanning::forecast)}});
  return group;
}

const KeyRegistry& train_key_registry() {
  static const KeyRegistry registry(kTrainCommand,
                                    {model_keys(), training_keys(), data_keys(), train_output_keys(), moe_layer_keys(),
                                     train_expert_parallel_keys(), modelled_time_keys(), runtime_keys()});
  return registry;
}

struct TrainArguments {
  std::string config_file;
  std::vector<std::string> assignments;
};

// The EP group's collective tags start above the trainer's [0, 1024).
constexpr std::uint32_t kEpGroupTagBase = 1024;

ProgressMode progress_mode(const std::string& value) {
  return value == "on" ? ProgressMode::on : value == "off" ? ProgressMode::off : ProgressMode::auto_detect;
}

// balance defaults to dynamic where replicas can apply: not on one rank (no
// other rank to hold a replica; the run keeps the local dispatcher) nor with
// capacity_factor > 0 (replica quotas are exact). There it is off, as if set.
ConfigValues train_values(const TrainArguments& arguments) {
  std::vector<run::KeyAssignment> assignments =
      command_assignments(arguments.config_file, arguments.assignments, kTrainCommand);
  const ConfigValues values = train_key_registry().parse(assignments);
  const bool one_rank = values.get_string("transport") == "threads" && values.get_int32("ranks") == 1;
  if (values.is_set("balance") || !(one_rank || values.get_float("capacity_factor") > 0)) return values;
  assignments.insert(assignments.begin(), {"balance", "off", "epmoe train's default where replicas cannot apply"});
  return train_key_registry().parse(assignments);
}

void run_train_command(const TrainArguments& arguments) {
  const ConfigValues values = train_values(arguments);
  const MoeLmConfig model = moe_lm_config_from(values);
  // The rank count first (ranks= or the mpirun world), then every rule that
  // involves it: batch_size, then num_experts (in the EP settings).
  const int world = values.get_string("transport") == "mpi"
                        ? mpi_launch_from_environment().value_or(MpiLaunch{}).world_size
                        : values.get_int32("ranks");
  const TrainerConfig trainer = trainer_config_from(values, model, world);
  ExpertParallelSettings settings = expert_parallel_settings_from(values, model.layer);
  settings.ep.replica_planning = ep::parse_replica_planning("replica_planning", values.get_string("replica_planning"));
  const std::unique_ptr<FaultInjector> faults =
      fault_injector_from(values, settings.num_ranks, FaultSpecSource::key_or_environment);
  settings.faults = faults.get();
  const bool writes = settings.transport == TransportKind::threads ||
                      mpi_launch_from_environment().value_or(MpiLaunch{}).world_rank == 0;
  const std::string metrics_path = values.get_string("metrics_file");
  // Every path the run writes, before anything is created or computed: an
  // unwritable one would otherwise fail the run after its work (the trace is
  // written after the last step). Other MPI ranks write none of them.
  if (writes) {
    check_output_paths({{"trace_file", settings.trace_file, OutputPath::Kind::file},
                        {"metrics_file", metrics_path, OutputPath::Kind::file},
                        {"checkpoint_dir", trainer.checkpoint_dir, OutputPath::Kind::directory}});
  }
  std::optional<TraceRecorder> trace;
  if (!settings.trace_file.empty()) {
    trace.emplace();
    settings.trace = &*trace;
  }
  // One trainer per checkpoint directory, held by the writing process for
  // the whole run. Taken before anything is read from the directory, so what
  // is read (the resume point, leftovers) cannot change under us. Other MPI
  // ranks never write it (rank 0 commits) and take no lock.
  std::optional<CheckpointDirLock> checkpoint_lock;
  if (writes && !trainer.checkpoint_dir.empty()) {
    checkpoint_lock.emplace(trainer.checkpoint_dir);  // a second trainer is refused before writing anything
  }
  const std::optional<std::int64_t> resume_from = checkpoint_to_resume(trainer);
  if (checkpoint_lock) {
    // With the lock held no live trainer owns these: they are a killed
    // run's. Said, not silently dropped.
    for (const std::filesystem::path& stale : CheckpointStore(trainer.checkpoint_dir).remove_stale_leftovers()) {
      std::printf("epmoe train: removed %s (left by a run killed while writing or pruning checkpoints)\n",
                  stale.c_str());
    }
  }
  if (resume_from && *resume_from >= trainer.steps) {
    if (writes) {
      std::printf("epmoe train: the newest checkpoint (%s) is at step %lld of steps=%lld; nothing to do\n",
                  CheckpointStore(trainer.checkpoint_dir).step_dir(*resume_from).c_str(),
                  static_cast<long long>(*resume_from), static_cast<long long>(trainer.steps));
    }
    return;
  }

  std::optional<MetricsFile> metrics;
  std::optional<ProgressLine> progress;
  progress.emplace(progress_mode(values.get_string("progress")), trainer.steps, values.get_int("log_every"));
  TrainObserver observer;
  observer.on_start = [&](std::int64_t first_step, std::optional<std::int64_t> resumed) {
    if (!metrics_path.empty()) {
      metrics.emplace(metrics_path, resumed);
      if (!metrics->missing_steps().empty()) {
        std::printf(
            "epmoe train: note: metrics_file=%s has no lines for steps %s of the checkpoint's past "
            "(another metrics_file, or lost); this run appends from step %lld\n",
            metrics_path.c_str(), metrics->missing_steps().c_str(), static_cast<long long>(*resumed + 1));
      }
    }
    if (resumed) std::printf("epmoe train: resuming from step %lld\n", static_cast<long long>(*resumed));
    progress->start(first_step);
  };
  observer.on_note = [&](const std::string& note) { std::printf("epmoe train: note: %s\n", note.c_str()); };
  double modelled_seconds = 0;  // clock=modelled: the steps' modelled time
  observer.on_step = [&](const StepRecord& record) {
    if (metrics) metrics->append(record);
    if (!record.modelled.is_null()) modelled_seconds += record.modelled["step_seconds"].get<double>();
    progress->update(record);
  };

  std::optional<TrainSummary> summary;
  launch_ranks(settings, [&](transport::Communicator& comm) {
    const std::unique_ptr<EpGroup> group = settings.make_group(&comm, kEpGroupTagBase);
    TrainSummary own = train(comm, *group, trainer, model, observer);
    if (comm.rank() == 0) summary = std::move(own);
  });
  if (!summary) return;  // an MPI rank other than 0
  progress.reset();      // ends an in-place line before the summary
  const double tokens = static_cast<double>(summary->steps_run * trainer.batch_size * trainer.data.seq_len);
  std::printf(
      "epmoe train: %lld steps on %d rank(s) (%s, dispatch=%s) in %.1f s, %.1fk tok/s; loss %.4f -> %.4f "
      "(floor: the data's entropy rate %.4f)",
      static_cast<long long>(summary->steps_run), settings.num_ranks, to_string(settings.transport).c_str(),
      to_string(settings.ep.dispatch).c_str(), summary->seconds, tokens / summary->seconds / 1e3,
      summary->losses.front(), summary->losses.back(), SyntheticTokens(trainer.data).entropy_rate_nats());
  std::printf("; dropped %lld of %lld (token, expert) pairs", static_cast<long long>(summary->dropped_pairs),
              static_cast<long long>(summary->routed_pairs));
  if (summary->dropped_pairs > 0) {
    std::printf(" (%.2f%%, capacity_factor=%g)",
                100.0 * static_cast<double>(summary->dropped_pairs) / static_cast<double>(summary->routed_pairs),
                settings.ep.capacity_factor);
  }
  if (metrics) std::printf("; metrics in %s", metrics->path().c_str());
  if (summary->last_checkpoint) {
    std::printf("; checkpoint %s", CheckpointStore(trainer.checkpoint_dir).step_dir(*summary->last_checkpoint).c_str());
  }
  std::printf("\n");
  if (settings.modelled.enabled && modelled_seconds > 0) {
    std::printf(
        "  modelled on %s: %.1fk tok/s, %.3f ms per step (metrics.jsonl \"modelled\": per rank compute, "
        "communication, idle; critical rank; hidden fraction per collective)\n",
        settings.hardware.c_str(), tokens / modelled_seconds / 1e3,
        modelled_seconds / static_cast<double>(summary->steps_run) * 1e3);
  }
  if (trace) {
    trace->write(settings.trace_file);
    std::printf("  trace: %s (%zu events; open in https://ui.perfetto.dev)\n", settings.trace_file.c_str(),
                trace->num_events());
  }
  // The pictures of the run (python/epmoe/report.py, in the Python package).
  if (metrics) {
    const std::filesystem::path report = metrics->path().parent_path() / "report.html";
    std::printf("  report: python -m epmoe.report %s%s%s --out %s\n", metrics->path().c_str(), trace ? " --trace " : "",
                trace ? settings.trace_file.c_str() : "", report.c_str());
  }
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto arguments = std::make_shared<TrainArguments>();
  CLI::App* command = app.add_subcommand(
      kTrainCommand,
      "Train a tiny MoE language model on synthetic uniform or Zipf tokens, expert-parallel over "
      "ranks=R threads or mpirun processes (transport=mpi), with checkpoints and JSON-lines metrics");
  command
      ->add_option("--config", arguments->config_file,
                   "YAML file of keys (e.g. configs/train_example.yaml); key=value arguments override it")
      ->check(non_empty_config_path);
  command->add_option("assignments", arguments->assignments, "key=value settings (see Keys below)");
  command->footer(train_key_registry().help_text());
  command->callback([arguments] { run_train_command(*arguments); });
}

}  // namespace epmoe::cli
