"""What `python -m epmoe.report` reads, checked before anything is drawn.

Files are read bounded: only regular files (a FIFO would block, /dev/zero
never ends), at most MAX_INPUT_BYTES, UTF-8. What is read is checked
against a schema (below: METRICS_RECORD, PHASE_EVENT, REPLAY) that names,
for every field the report draws, its type, its range and how many items
the drawing takes; the sizes of every figure follow from those limits, so
memory and time are bounded by them. A field that breaks its rule is a
ReportError naming the file, the line (metrics.jsonl) and the field's path.
Fields the report does not draw are not checked.
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass

# A 500-step default run writes 1.6 MB of metrics and a trace of ~90 MB;
# parsed JSON takes ~10x its text in memory, so this keeps the report
# under ~3 GB.
MAX_INPUT_BYTES = 256 * 2**20
# What one figure draws: DeepSeek-V3 has 58 MoE layers and 256 experts, the
# largest replays seen 1024 ranks; a placement heatmap is then at most 4M cells.
MAX_LAYERS = 64
MAX_EXPERTS = 4096
MAX_RANKS = 1024
MAX_NAMES = 128  # phases or collectives stacked in one chart (a run has ~20)
MAX_POLICIES = 16  # a replay has 4
MAX_INT = 2**63 - 1


class ReportError(ValueError):
    """A metrics, trace or replay file (or an argument) that cannot be drawn, naming the file and the line."""


# ---------------------------------------------------------------- files --


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def _refuse_unless_regular(path: str, what: str, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise ReportError(f"{path}: the {what} must be a regular file, and this is {_file_kind(mode)}")


def read_text(path: str, what: str) -> str:
    """The whole text of a regular file of at most MAX_INPUT_BYTES of UTF-8.
    The file is stat'ed before it is opened, and opened non-blocking, so a
    FIFO (or one put in its place meanwhile) never blocks the reader."""
    try:
        _refuse_unless_regular(path, what, os.stat(path).st_mode)
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise ReportError(f"{path}: cannot read the {what}: {error.strerror}") from None
    try:
        status = os.fstat(descriptor)
        _refuse_unless_regular(path, what, status.st_mode)
        too_large = f"{path}: the {what} is larger than the report reads ({MAX_INPUT_BYTES // 2**20} MiB)"
        if status.st_size > MAX_INPUT_BYTES:
            raise ReportError(f"{too_large}: {status.st_size} bytes")
        with os.fdopen(descriptor, "rb", closefd=False) as f:
            data = f.read(MAX_INPUT_BYTES + 1)  # the file may grow while it is read
    except OSError as error:
        raise ReportError(f"{path}: cannot read the {what}: {error.strerror}") from None
    finally:
        os.close(descriptor)
    if len(data) > MAX_INPUT_BYTES:
        raise ReportError(too_large)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ReportError(f"{path}:{line}: the {what} is not UTF-8 text (byte 0x{data[error.start]:02x} at "
                          f"offset {error.start})") from None


def parse_json(text: str, path: str, what: str, line: int | None = None):
    """json.loads of a whole file, or of its line `line`; any failure is a
    ReportError naming the file and the line."""
    where = path if line is None else f"{path}:{line}"
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        at = f"{path}:{error.lineno if line is None else line}"
        raise ReportError(f"{at}: the {what} is not JSON ({error.msg}, column {error.colno})") from None
    except RecursionError:
        raise ReportError(f"{where}: the {what} nests arrays or objects deeper than the report reads") from None
    except ValueError as error:  # e.g. an integer of more than 4300 digits
        raise ReportError(f"{where}: the {what} is not JSON the report reads ({error})") from None


# --------------------------------------------------------------- schema --
# A schema is a tree of the classes below; check(value, schema, ...) walks
# it beside the value. Dimensions tie fields together: a list with
# `dimension="experts"` must have the length the first such list had (in
# any record of the file), and an Integer with `below="num_experts"` must be
# less than the value an Integer with `dimension="num_experts"` bound.


@dataclass(frozen=True)
class Integer:
    minimum: int = 0
    maximum: int = MAX_INT
    below: str | None = None  # a bound dimension the value indexes
    dimension: str | None = None  # the value binds this dimension


@dataclass(frozen=True)
class Number:
    minimum: float | None = None


@dataclass(frozen=True)
class Text:
    pass


@dataclass(frozen=True)
class ListOf:
    item: object
    max_length: int | None = None  # None: as many as the file holds
    dimension: str | None = None
    min_length: int = 0
    unit: str = "items"


@dataclass(frozen=True)
class MapOf:
    value: object
    max_length: int


@dataclass(frozen=True)
class Record:
    fields: dict
    required: tuple = ()


@dataclass(frozen=True)
class Triple:
    names: tuple  # [a, b, c] with these meanings
    items: tuple


def _shown(value) -> str:
    """A value as the message shows it: its JSON type and a short text."""
    kinds = {bool: "a boolean", str: "a string", list: "an array", dict: "an object", type(None): "null",
             int: "an integer", float: "a number"}
    text = json.dumps(value) if not isinstance(value, (list, dict)) else ""
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{kinds.get(type(value), type(value).__name__)} {text}".rstrip()


def _field(path: str, key) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else key)


class Dimensions:
    """The lengths and values bound so far (shared by every record of one file)."""

    def __init__(self) -> None:
        self.bound: dict[str, tuple[int, str]] = {}  # name -> (value, where it was bound)

    def bind(self, name: str, value: int, where: str, path: str, unit: str) -> None:
        if name not in self.bound:
            self.bound[name] = (value, f"{where} {path}")
        elif self.bound[name][0] != value:
            first, at = self.bound[name]
            raise ReportError(f"{where}: {path}: {value} {unit}, where {at} has {first} (every record has the "
                              "same shape)")


def check(value, schema, where: str, dimensions: Dimensions, path: str = "") -> None:
    """Raises a ReportError at `where` naming the field `path` when `value` breaks `schema`."""

    def fail(rule: str):
        raise ReportError(f"{where}: {path or 'the top level'}: {rule}")

    if isinstance(schema, Integer):
        if type(value) is not int:
            fail(f"must be an integer, got {_shown(value)}")
        if value < schema.minimum:
            fail(f"{value} is negative" if schema.minimum == 0 else f"{value} is less than {schema.minimum}")
        if value > schema.maximum:
            fail(f"{value} is more than the report draws (at most {schema.maximum})")
        if schema.below is not None:
            bound, at = dimensions.bound[schema.below]
            if value >= bound:
                fail(f"{value} is not an index below {schema.below}={bound} ({at})")
        if schema.dimension is not None:
            dimensions.bind(schema.dimension, value, where, path, "")
    elif isinstance(schema, Number):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            fail(f"must be a number, got {_shown(value)}")
        if schema.minimum is not None and not (value >= schema.minimum or math.isnan(value)):
            fail(f"{value} is less than {schema.minimum}")
    elif isinstance(schema, Text):
        if not isinstance(value, str):
            fail(f"must be a string, got {_shown(value)}")
    elif isinstance(schema, ListOf):
        if not isinstance(value, list):
            fail(f"must be an array, got {_shown(value)}")
        if len(value) < schema.min_length:
            fail(f"must have at least {schema.min_length} {schema.unit}")
        if schema.max_length is not None and len(value) > schema.max_length:
            fail(f"{len(value)} {schema.unit}, more than the report draws (at most {schema.max_length})")
        if schema.dimension is not None:
            dimensions.bind(schema.dimension, len(value), where, path, schema.unit)
        for index, item in enumerate(value):
            check(item, schema.item, where, dimensions, _field(path, index))
    elif isinstance(schema, MapOf):
        if not isinstance(value, dict):
            fail(f"must be an object, got {_shown(value)}")
        if len(value) > schema.max_length:
            fail(f"{len(value)} names, more than the report draws (at most {schema.max_length})")
        for key, item in value.items():
            check(item, schema.value, where, dimensions, _field(path, key))
    elif isinstance(schema, Record):
        if not isinstance(value, dict):
            fail(f"must be an object, got {_shown(value)}")
        for key in schema.required:
            if key not in value:
                fail(f"has no '{key}'")
        for key, field_schema in schema.fields.items():  # in the schema's order: dimensions bind first
            if key in value:
                check(value[key], field_schema, where, dimensions, _field(path, key))
    elif isinstance(schema, Triple):
        if not isinstance(value, list) or len(value) != len(schema.items):
            fail(f"must be [{', '.join(schema.names)}], got {_shown(value)}")
        for index, (name, item_schema) in enumerate(zip(schema.names, schema.items)):
            check(value[index], item_schema, where, dimensions, f"{_field(path, index)} ({name})")
    else:
        raise TypeError(f"not a schema: {schema!r}")


def _per_layer(item) -> ListOf:
    return ListOf(item, MAX_LAYERS, min_length=1, unit="MoE layers")


# One line of `epmoe train`'s metrics.jsonl: the fields the report draws.
METRICS_RECORD = Record(
    required=("step",),
    fields={
        "step": Integer(),
        "loss": Number(),
        "cross_entropy": Number(),
        "tokens_per_second": Number(minimum=0),
        "step_seconds": Number(minimum=0),
        "expert_counts": ListOf(ListOf(Integer(), MAX_EXPERTS, dimension="experts", min_length=1, unit="experts"),
                                MAX_LAYERS, dimension="MoE layers", min_length=1, unit="MoE layers"),
        "rank_load_max_over_mean_before": _per_layer(Number()),
        "rank_load_max_over_mean_after": _per_layer(Number()),
        "expert_load_max_over_mean": _per_layer(Number()),
        "phase_seconds": MapOf(Number(minimum=0), MAX_NAMES),
        "bytes_sent": MapOf(Number(minimum=0), MAX_NAMES),
        "modelled": Record({
            "step_seconds": Number(minimum=0),
            "per_rank": ListOf(
                Record(required=("rank",), fields={
                    "rank": Integer(maximum=MAX_RANKS - 1),
                    "compute_seconds": Number(minimum=0),
                    "communication_seconds": Number(minimum=0),
                    "idle_seconds": Number(minimum=0),
                }), MAX_RANKS, unit="ranks"),
        }),
    },
)

# A Chrome-trace event the timeline draws (ph "X", cat "phase"); epmoe's pid is the rank.
PHASE_EVENT = Record(
    required=("name", "ts", "dur", "pid"),
    fields={"name": Text(), "ts": Number(), "dur": Number(minimum=0), "pid": Integer(maximum=MAX_RANKS - 1)},
)

# `epmoe balance --loads ... --json`: header first, so the copies' indices
# are checked against num_experts and config.ranks.
_POLICY = Record(
    required=("policy",),
    fields={
        "policy": Text(),
        "mean_max_over_mean": Number(),
        "worst_max_over_mean": Number(),
        "mean_weight_bytes_moved_per_step": Number(minimum=0),
        "steps": ListOf(Record(
            required=("max_over_mean",),
            fields={
                "max_over_mean": Number(),
                "copies": ListOf(Triple(("expert", "rank", "tokens"),
                                        (Integer(below="num_experts"), Integer(below="ranks"), Integer()))),
            }), unit="steps"),
    },
)
REPLAY = Record(
    required=("num_experts", "config"),
    fields={
        "num_experts": Integer(minimum=1, maximum=MAX_EXPERTS, dimension="num_experts"),
        "config": Record(required=("ranks",), fields={"ranks": Integer(minimum=1, maximum=MAX_RANKS,
                                                                         dimension="ranks")}),
        "policies": ListOf(_POLICY, MAX_POLICIES, min_length=1, unit="policies"),
        "layers": ListOf(Record(required=("layer", "policies"), fields={
            "layer": Integer(),
            "policies": ListOf(_POLICY, MAX_POLICIES, min_length=1, unit="policies"),
        }), MAX_LAYERS, min_length=1, unit="MoE layers"),
    },
)


# -------------------------------------------------------------- readers --


def read_metrics_records(path: str) -> tuple[list[dict], int]:
    """(records in step order, torn last lines). A line that is not a JSON
    object, breaks METRICS_RECORD, or a file without any step, is a
    ReportError naming the file and the line; a run killed mid-write leaves
    a torn last line, which is skipped and counted (the report says so)."""
    lines = read_text(path, "metrics file").split("\n")  # not splitlines: JSON text may hold U+2028
    while lines and not lines[-1].strip():
        lines.pop()
    records, torn, dimensions = [], 0, Dimensions()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = parse_json(line, path, "metrics line", number)
        except ReportError:
            if number == len(lines):  # a run stopped while writing its last line
                torn += 1
                continue
            raise
        if not isinstance(record, dict) or "step" not in record:
            raise ReportError(f"{where}: a metrics line must be an object with a 'step' key")
        check(record, METRICS_RECORD, where, dimensions)
        records.append(record)
    if not records:
        raise ReportError(f"{path}: no step records (is it epmoe train's metrics_file?)")
    records.sort(key=lambda r: r["step"])
    return records, torn


def read_phase_events(path: str) -> list[dict]:
    """The phase events of a Chrome trace, each checked against PHASE_EVENT."""
    trace = parse_json(read_text(path, "trace"), path, "trace")
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        raise ReportError(f"{path}: a Chrome trace is a list of events or an object with 'traceEvents'")
    phases, dimensions = [], Dimensions()
    for index, event in enumerate(events):
        if isinstance(event, dict) and event.get("ph") == "X" and event.get("cat") == "phase":
            check(event, PHASE_EVENT, path, dimensions, f"traceEvents[{index}]")
            phases.append(event)
    return phases


def read_replay(path: str) -> dict:
    """`epmoe balance --json`'s replay, checked against REPLAY; it has
    'policies' (loads from an .npy) or 'layers' (from a metrics.jsonl)."""
    replay = parse_json(read_text(path, "balance replay"), path, "balance replay")
    check(replay, REPLAY, path, Dimensions())
    if "policies" not in replay and "layers" not in replay:
        raise ReportError(f"{path}: a balance replay has 'policies' (or 'layers' with policies): "
                          "the output of epmoe balance --loads ... --json")
    return replay
