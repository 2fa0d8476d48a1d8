"""Pictures of a run, as one self-contained HTML file.

    python -m epmoe.report METRICS.jsonl [--trace TRACE.json] --out report.html
    python -m epmoe.report --balance REPLAY.json --out balance.html

The first reads `epmoe train`'s metrics (one JSON line per step) and draws:
loss and tokens/s over steps; the expert-load heatmap (step x expert) of
every MoE layer; the rank load's max/mean before and after balancing; the
per-phase breakdown of each step; the bytes each collective sent; modelled
beside wall time when the run had clock=modelled; and, with --trace, every
rank's phases on a timeline. The second reads `epmoe balance --json`'s replay
and draws max/mean per step for each policy and where each policy put its
copies. The figures are PNGs inlined as data: URIs, so the file opens
anywhere with no other file beside it.

Every input is read bounded and checked against a schema before anything is
drawn (_report_input.py); bad input is one line, "epmoe.report: error:
FILE:LINE: FIELD: rule", exit status 2, and no --out file. Drawing needs only
the standard library, numpy and matplotlib (no compiled code of epmoe's).
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field

from ._report_input import ReportError, read_metrics_records, read_phase_events, read_replay

__all__ = ["ReportError", "read_metrics", "training_report", "balance_report", "main"]


# ---------------------------------------------------------------- reading --


def read_metrics(path: str) -> list[dict]:
    """The step records of a metrics.jsonl, in step order (see read_metrics_records)."""
    return read_metrics_records(path)[0]


# ---------------------------------------------------------------- drawing --


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    return plt


def _panels(count: int, width: float, height: float, columns: int = 3):
    """A figure of `count` panels (one per MoE layer or policy), at most
    `columns` a row, so that its width stays bounded however many there are;
    returns (figure, the first `count` axes)."""
    plt = _pyplot()
    columns = min(count, columns)
    rows = -(-count // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for unused in flat[count:]:
        unused.set_visible(False)
    return figure, flat[:count]


@dataclass
class _Page:
    title: str
    subtitle: str = ""
    sections: list[tuple[str, str, str]] = field(default_factory=list)  # (heading, caption, img data URI)
    notes: list[str] = field(default_factory=list)
    table: list[list[str]] = field(default_factory=list)  # a summary: header row, then rows

    def add(self, heading: str, caption: str, figure) -> None:
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=96, bbox_inches="tight")
        _pyplot().close(figure)
        uri = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
        self.sections.append((heading, caption, uri))

    def html(self) -> str:
        parts = [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            f"<title>{html.escape(self.title)}</title>",
            "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}"
            "figure{margin:1.5em 0}img{max-width:100%}figcaption{color:#444}"
            "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:0.2em 0.6em;text-align:right}</style>",
            "</head>",
            "<body>",
            f"<h1>{html.escape(self.title)}</h1>",
        ]
        if self.subtitle:
            parts.append(f"<p>{html.escape(self.subtitle)}</p>")
        for note in self.notes:
            parts.append(f'<p class="note">{html.escape(note)}</p>')
        if self.table:
            parts.append("<table>")
            parts.append("<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in self.table[0]) + "</tr>")
            for row in self.table[1:]:
                parts.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
            parts.append("</table>")
        for heading, caption, uri in self.sections:
            parts += [
                f"<h2>{html.escape(heading)}</h2>",
                "<figure>",
                f'<img src="{uri}" alt="{html.escape(heading)}">',
                f"<figcaption>{html.escape(caption)}</figcaption>",
                "</figure>",
            ]
        parts += ["</body>", "</html>", ""]
        return "\n".join(parts)


def _draw_loss_and_rate(page: _Page, records: list[dict]) -> None:
    plt = _pyplot()
    steps = [r["step"] for r in records]
    figure, (loss_axes, rate_axes) = plt.subplots(1, 2, figsize=(11, 3.5))
    loss_axes.plot(steps, [r.get("loss", math.nan) for r in records], label="loss")
    if any("cross_entropy" in r for r in records):
        loss_axes.plot(steps, [r.get("cross_entropy", math.nan) for r in records], label="cross entropy", alpha=0.7)
    loss_axes.set_xlabel("step")
    loss_axes.set_ylabel("nats per token")
    loss_axes.legend()
    rate_axes.plot(steps, [r.get("tokens_per_second", math.nan) for r in records], color="tab:green")
    rate_axes.set_xlabel("step")
    rate_axes.set_ylabel("tokens/s (wall)")
    page.add("Loss and throughput", "Training loss per step (left) and wall-clock tokens per second (right).", figure)


def _draw_expert_loads(page: _Page, records: list[dict]) -> None:
    rows = [r for r in records if r.get("expert_counts")]
    if not rows:
        return
    # Every record has the same [layers][experts] shape (the schema's dimensions).
    num_layers = len(rows[0]["expert_counts"])
    figure, axes = _panels(num_layers, 5.5, 4)
    for layer, ax in enumerate(axes):
        grid = [r["expert_counts"][layer] for r in rows]
        image = ax.imshow(
            grid, aspect="auto", interpolation="nearest", cmap="viridis", origin="lower",
            extent=(-0.5, len(grid[0]) - 0.5, rows[0]["step"] - 0.5, rows[-1]["step"] + 0.5))
        ax.set_title(f"MoE layer {layer}")
        ax.set_xlabel("expert")
        ax.set_ylabel("step")
        figure.colorbar(image, ax=ax, label="(token, expert) pairs")
    page.add("Expert load", "Routed (token, expert) pairs per expert and step, one heatmap per MoE layer.", figure)


def _draw_rank_balance(page: _Page, records: list[dict]) -> None:
    keys = ("rank_load_max_over_mean_before", "rank_load_max_over_mean_after", "expert_load_max_over_mean")
    if not any(k in r for r in records for k in keys):
        return
    steps = [r["step"] for r in records]
    num_layers = max(len(r.get(keys[0], r.get(keys[2], [0]))) for r in records)
    figure, axes = _panels(num_layers, 5.5, 3.5)
    for layer, ax in enumerate(axes):
        for key, label in zip(keys, ("rank load, before balancing", "rank load, after balancing", "expert load")):
            values = [r[key][layer] if key in r and len(r[key]) > layer else math.nan for r in records]
            if not all(math.isnan(v) for v in values):
                ax.plot(steps, values, label=label)
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
        ax.set_title(f"MoE layer {layer}")
        ax.set_xlabel("step")
        ax.set_ylabel("max / mean")
        if ax.get_legend_handles_labels()[0]:  # a layer only some records have may have no line
            ax.legend(fontsize="small")
    page.add(
        "Balance",
        "Max over mean of the per-rank load before and after the step's replicas (balance=dynamic; equal "
        "without replicas), and of the per-expert load. 1 is perfect balance.",
        figure,
    )


def _draw_phases(page: _Page, records: list[dict]) -> None:
    rows = [r for r in records if r.get("phase_seconds")]
    if not rows:
        return
    plt = _pyplot()
    # The step's top-level phases are the names without a '/' (the layer's
    # own phases, "moe/...", are parts of forward and backward).
    names = sorted({name for r in rows for name in r["phase_seconds"] if "/" not in name})
    steps = [r["step"] for r in rows]
    figure, (top, moe) = plt.subplots(1, 2, figsize=(11, 3.8))
    top.stackplot(steps, [[r["phase_seconds"].get(n, 0.0) * 1e3 for r in rows] for n in names], labels=names)
    top.set_xlabel("step")
    top.set_ylabel("ms")
    top.set_title("step phases")
    top.legend(fontsize="x-small", loc="upper right")
    moe_names = sorted({name for r in rows for name in r["phase_seconds"] if name.startswith("moe/")})
    if moe_names:
        moe.stackplot(steps, [[r["phase_seconds"].get(n, 0.0) * 1e3 for r in rows] for n in moe_names],
                      labels=[n[4:] for n in moe_names])
        moe.legend(fontsize="x-small", loc="upper right", ncol=2)
    moe.set_xlabel("step")
    moe.set_ylabel("ms")
    moe.set_title("MoE layers' phases (all layers)")
    page.add("Where the step's time goes", "Seconds per phase of each step, stacked, rank 0, in the run's clock "
             "(modelled seconds with clock=modelled).", figure)


def _draw_bytes(page: _Page, records: list[dict]) -> None:
    rows = [r for r in records if r.get("bytes_sent")]
    if not rows:
        return
    plt = _pyplot()
    names = sorted({name for r in rows for name in r["bytes_sent"]})
    means = [sum(r["bytes_sent"].get(n, 0) for r in rows) / len(rows) / 2**20 for n in names]
    figure, ax = plt.subplots(figsize=(9, 0.35 * len(names) + 1.2))
    ax.barh(names, means, color="tab:purple")
    ax.invert_yaxis()
    ax.set_xlabel("MiB per step (mean over steps, all ranks)")
    page.add("Bytes per collective", "Bytes sent to other ranks per step, by collective.", figure)


def _draw_modelled(page: _Page, records: list[dict]) -> None:
    rows = [r for r in records if isinstance(r.get("modelled"), dict) and "step_seconds" in r["modelled"]]
    if not rows:
        return
    plt = _pyplot()
    steps = [r["step"] for r in rows]
    figure, (times, split) = plt.subplots(1, 2, figsize=(11, 3.5))
    # A modelled run's step_seconds is the modelled step too (no wall time
    # in its metrics, docs/MODELLED_TIME.md): one line.
    times.plot(steps, [r["modelled"]["step_seconds"] * 1e3 for r in rows], label="modelled")
    times.set_yscale("log")
    times.set_xlabel("step")
    times.set_ylabel("modelled ms per step")
    last = rows[-1]["modelled"].get("per_rank", [])
    if last:
        ranks = [p["rank"] for p in last]
        bottom = [0.0] * len(ranks)
        for key in ("compute_seconds", "communication_seconds", "idle_seconds"):
            values = [p.get(key, 0.0) * 1e6 for p in last]
            split.bar(ranks, values, bottom=bottom, label=key.replace("_seconds", ""))
            bottom = [b + v for b, v in zip(bottom, values)]
        if len(ranks) <= 32:
            split.set_xticks(ranks)
        split.set_xlabel("rank")
        split.set_ylabel("µs (modelled, last step)")
        split.legend(fontsize="small")
    page.add("Modelled beside wall time",
             "Step time on this machine and on the modelled hardware (clock=modelled), and each rank's modelled "
             "compute, exposed communication and idle time in the last step.", figure)


def _draw_trace(page: _Page, trace_path: str, phases: list[dict]) -> None:
    if not phases:
        page.notes.append(f"{trace_path}: no phase events to draw.")
        return
    # The first step of every rank: forward and backward are the top-level
    # phases; the timeline shows the time up to the end of the first backward.
    end = min((e["ts"] + e["dur"] for e in phases if e["name"] == "backward"), default=None)
    shown = [e for e in phases if end is None or e["ts"] < end]
    plt = _pyplot()
    ranks = sorted({e["pid"] for e in shown})
    names = sorted({e["name"] for e in shown})
    colours = {n: plt.cm.tab20(i % 20) for i, n in enumerate(names)}
    # The height grows with the ranks up to a bound (1024 ranks still make a
    # picture, at a few pixels a rank).
    figure, ax = plt.subplots(figsize=(11, min(0.5 * len(ranks), 24) + 1.5))
    # One bar collection per (level, rank, phase), not one per event: a trace
    # without a backward shows every event, and matplotlib's time and memory
    # grow with the number of collections.
    bars: dict[tuple[int, int, str], list[tuple[float, float]]] = {}
    for e in shown:
        # Nested phases (route inside forward) are drawn thinner, on top.
        level = 0 if e["name"] in ("forward", "backward") else 1
        bars.setdefault((level, e["pid"], e["name"]), []).append((e["ts"], e["dur"]))
    for (level, rank, name), spans in sorted(bars.items()):
        height = 0.8 if level == 0 else 0.45
        ax.broken_barh(spans, (rank - height / 2, height), color=colours[name], alpha=0.5 if level == 0 else 0.95)
    if len(ranks) <= 48:
        ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylabel("rank")
    ax.invert_yaxis()
    ax.set_xlabel("µs (the run's clock)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[n]) for n in names]
    ax.legend(handles, names, fontsize="x-small", ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    page.add("Timeline of the first step", f"Every rank's phases in {os.path.basename(trace_path)}, up to the end "
             "of the first backward (open the trace in https://ui.perfetto.dev for every event).", figure)


def training_report(metrics_path: str, trace_path: str | None = None) -> str:
    """The HTML report of an `epmoe train` run's metrics (and trace)."""
    # Every input is read and checked before the first figure is drawn.
    records, torn = read_metrics_records(metrics_path)
    phases = read_phase_events(trace_path) if trace_path else None
    page = _Page(
        title=f"epmoe run: {os.path.basename(os.path.dirname(os.path.abspath(metrics_path))) or metrics_path}",
        subtitle=f"{metrics_path}: {len(records)} steps ({records[0]['step']} to {records[-1]['step']}), "
        f"loss {records[0].get('loss', math.nan):.4f} -> {records[-1].get('loss', math.nan):.4f}",
    )
    if torn:
        page.notes.append(f"{metrics_path}: its last line was cut short (a stopped run) and is not drawn.")
    _draw_loss_and_rate(page, records)
    _draw_expert_loads(page, records)
    _draw_rank_balance(page, records)
    _draw_phases(page, records)
    _draw_bytes(page, records)
    _draw_modelled(page, records)
    if trace_path:
        _draw_trace(page, trace_path, phases)
    return page.html()


def balance_report(replay_path: str) -> str:
    """The HTML report of `epmoe balance --loads ... --json`'s replay."""
    import numpy as np

    replay = read_replay(replay_path)
    # (layer, policies) per replayed layer: "all" for loads from an .npy, the
    # MoE layer's index for each layer of a metrics.jsonl.
    if replay.get("policies"):
        layers = [("all", replay["policies"])]
    else:
        layers = [(str(layer["layer"]), layer["policies"]) for layer in replay["layers"]]
    num_experts, num_ranks = replay["num_experts"], replay["config"]["ranks"]
    page = _Page(title="epmoe balance replay",
                 subtitle=f"{replay.get('loads', replay_path)}: {replay.get('num_steps', '?')} steps, E={num_experts}, "
                 f"R={num_ranks}, {replay['config'].get('slots', '?')} redundant slots per rank")
    page.table = [["layer", "policy", "mean max/mean", "worst max/mean", "weight bytes moved per step"]]
    for label, policies in layers:
        for policy in policies:
            page.table.append([label, policy["policy"],
                               f"{policy.get('mean_max_over_mean', math.nan):.4f}",
                               f"{policy.get('worst_max_over_mean', math.nan):.4f}",
                               f"{policy.get('mean_weight_bytes_moved_per_step', 0.0):.3g}"])
    figure, axes = _panels(len(layers), 5.5, 3.8)
    for ax, (label, policies) in zip(axes, layers):
        for policy in policies:
            per_step = [s["max_over_mean"] for s in policy.get("steps", [])]
            ax.plot(range(len(per_step)), per_step,
                    label=f"{policy['policy']} (mean {policy.get('mean_max_over_mean', math.nan):.3f})")
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
        ax.set_title("loads of every layer" if label == "all" else f"MoE layer {label}")
        ax.set_xlabel("step")
        ax.set_ylabel("max / mean rank load")
        ax.legend(fontsize="small")
    page.add("Rank load per step", "Max over mean of the per-rank load of every step, per policy (1 = perfect).",
             figure)
    # Where each policy put its copies in the last step: tokens per (rank,
    # expert); a row with several bright cells holds copies of several experts.
    # The copies' indices are below num_experts and ranks (the schema), and
    # those are bounded, so the grid is too.
    label, policies = layers[0]
    placed = [p for p in policies if p.get("steps") and "copies" in p["steps"][-1]]
    if placed:
        figure, axes = _panels(len(placed), 4.2, 3.6, columns=4)
        for ax, policy in zip(axes, placed):
            grid = np.zeros((num_ranks, num_experts), dtype=np.int64)
            for expert, rank, quota in policy["steps"][-1]["copies"]:
                grid[rank, expert] += quota
            image = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="magma")
            ax.set_title(policy["policy"])
            ax.set_xlabel("expert")
            ax.set_ylabel("rank")
            figure.colorbar(image, ax=ax, label="tokens")
        page.add("Placement of the copies" + ("" if label == "all" else f" (MoE layer {label})"),
                 "Tokens each rank computes for each expert in the last step, per policy.", figure)
    else:
        page.notes.append("The replay has no per-step plans (plans=false): the placement is not drawn.")
    return page.html()


# ------------------------------------------------------------------- main --


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        # argparse prints the usage and the message on two lines and exits;
        # the report's errors are one line, printed by main.
        raise ReportError(message)


def _output_file(out: str) -> tuple[int, str]:
    """A new temporary file beside --out, made before anything is read or
    drawn, so an --out that cannot be written costs no work."""
    directory = os.path.dirname(os.path.abspath(out))
    if os.path.isdir(out):
        raise ReportError(f"--out {out}: is a directory; name the HTML file to write")
    if not os.path.isdir(directory):
        raise ReportError(f"--out {out}: its directory {directory} does not exist")
    try:
        descriptor, temporary = tempfile.mkstemp(prefix=os.path.basename(out) + ".", suffix=".partial",
                                                 dir=directory)
    except OSError as error:
        raise ReportError(f"--out {out}: cannot write in {directory}: {error.strerror}") from None
    umask = os.umask(0)  # mkstemp's file is 0600; the report gets the mode any new file would
    os.umask(umask)
    os.fchmod(descriptor, 0o666 & ~umask)
    return descriptor, temporary


def main(argv: list[str] | None = None) -> int:
    parser = _ArgumentParser(prog="python -m epmoe.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("metrics", nargs="?", help="epmoe train's metrics.jsonl")
    parser.add_argument("--trace", help="the run's Chrome trace (trace_file=)")
    parser.add_argument("--balance", help="epmoe balance --json output, instead of a metrics file")
    parser.add_argument("--out", required=True, help="the HTML file to write")
    descriptor = temporary = None
    try:
        args = parser.parse_args(argv)
        if bool(args.metrics) == bool(args.balance):
            raise ReportError("give either a metrics.jsonl or --balance REPLAY.json")
        if args.balance and args.trace:
            raise ReportError("--trace goes with a metrics.jsonl, not with --balance")
        descriptor, temporary = _output_file(args.out)
        text = balance_report(args.balance) if args.balance else training_report(args.metrics, args.trace)
        # Written whole or not at all: a reader never sees half a report.
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as f:
                descriptor = None
                f.write(text)
            os.replace(temporary, args.out)
        except OSError as error:
            raise ReportError(f"--out {args.out}: cannot write: {error.strerror}") from None
        temporary = None
    except ReportError as error:
        message = str(error).replace("\n", " ")
        print(f"epmoe.report: error: {message}", file=sys.stderr)
        return 2
    finally:
        if temporary is not None:
            if descriptor is not None:
                os.close(descriptor)
            os.unlink(temporary)
    print(f"epmoe.report: wrote {args.out} ({len(text) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
