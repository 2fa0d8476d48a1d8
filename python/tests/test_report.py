"""python -m epmoe.report on a real short training run (and its trace and
balance replay): the HTML is well formed and self-contained, every figure
is a real PNG, and a headless Chromium renders the page to a screenshot
that is not blank; the same for the report the main command (scripts/main.sh)
wrote. Malformed, oversized or non-regular inputs and unwritable outputs:
one line "epmoe.report: error: ..." naming the file, line and field, exit
status 2, and no file written."""

import base64
import html.parser
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from epmoe import _report_input, report

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EPMOE = os.environ.get("EPMOE_BINARY", os.path.join(REPO, "build", "epmoe"))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
VOID_TAGS = {"meta", "img", "br", "hr", "link", "input"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A real 12-step training run with balance=dynamic, clock=modelled and a trace."""
    if not os.access(EPMOE, os.X_OK):
        pytest.fail(f"the epmoe tool is not built at {EPMOE} (set EPMOE_BINARY or build the project)")
    directory = tmp_path_factory.mktemp("train")
    metrics, trace = directory / "metrics.jsonl", directory / "trace.json"
    done = subprocess.run(
        [EPMOE, "train", "steps=12", "batch_size=8", "seq_len=32", "ranks=2", "balance=dynamic", "redundant_slots=1",
         "clock=modelled", f"metrics_file={metrics}", f"trace_file={trace}"],
        capture_output=True, text=True, check=True)
    return {"dir": directory, "metrics": str(metrics), "trace": str(trace), "stdout": done.stdout}


@pytest.fixture(scope="module")
def training_page(run):
    """The run's report with its trace, drawn once for the tests that read it."""
    return report.training_report(run["metrics"], run["trace"])


class WellFormed(html.parser.HTMLParser):
    """Checks that every opened tag is closed in order, and collects the images."""

    def __init__(self):
        super().__init__()
        self.stack, self.images, self.errors = [], [], []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs))
        if tag not in VOID_TAGS:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
        else:
            self.stack.pop()


def check_page(text, min_images):
    parser = WellFormed()
    parser.feed(text)
    parser.close()
    assert text.startswith("<!DOCTYPE html>")
    assert not parser.errors, parser.errors
    assert not parser.stack, f"unclosed tags: {parser.stack}"
    assert len(parser.images) >= min_images
    for image in parser.images:
        prefix = "data:image/png;base64,"
        assert image["src"].startswith(prefix), "every figure is inlined: the file stands alone"
        assert base64.b64decode(image["src"][len(prefix):]).startswith(PNG_SIGNATURE)
    return parser.images


def test_train_prints_the_report_command(run):
    assert f"python -m epmoe.report {run['metrics']} --trace {run['trace']} --out" in run["stdout"]


def test_training_report_is_well_formed_and_has_every_figure(training_page):
    images = check_page(training_page, min_images=7)
    headings = [image["alt"] for image in images]
    for expected in ("Loss and throughput", "Expert load", "Balance", "Where the step's time goes",
                     "Bytes per collective", "Modelled beside wall time", "Timeline of the first step"):
        assert expected in headings


def test_the_command_line_writes_the_file_whole(run, tmp_path):
    out = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "epmoe.report", run["metrics"], "--trace", run["trace"],
                           "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    check_page(out.read_text(), min_images=7)
    assert not (tmp_path / "report.html.partial").exists()


def test_bad_files_are_refused_naming_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1, "loss": 2.0}\nnot json\n{"step": 3}\n')
    with pytest.raises(report.ReportError, match=r"bad.jsonl:2: the metrics line is not JSON"):
        report.training_report(str(bad))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(report.ReportError, match="no step records"):
        report.training_report(str(empty))
    done = subprocess.run([sys.executable, "-m", "epmoe.report", str(tmp_path / "missing.jsonl"), "--out",
                           str(tmp_path / "r.html")], capture_output=True, text=True)
    assert done.returncode == 2
    assert "missing.jsonl: cannot read" in done.stderr
    assert not (tmp_path / "r.html").exists()


def test_a_torn_last_line_is_skipped_and_said(run, tmp_path):
    torn = tmp_path / "torn.jsonl"
    lines = open(run["metrics"]).read().splitlines()
    torn.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])
    text = report.training_report(str(torn))
    assert "its last line was cut short" in text
    assert f"{len(lines) - 1} steps" in text


def test_balance_report_draws_every_policy_and_the_placement(run, tmp_path):
    replay = tmp_path / "replay.json"
    with open(replay, "w") as f:
        subprocess.run([EPMOE, "balance", "--loads", run["metrics"], "ranks=2", "slots=1", "window=4", "period=4",
                        "--json"], stdout=f, check=True)
    text = report.balance_report(str(replay))
    images = check_page(text, min_images=2)
    assert any(image["alt"].startswith("Placement of the copies") for image in images)
    # The summary table: one row per (layer, policy), with the replay's numbers.
    for layer in json.loads(replay.read_text())["layers"]:
        for policy in layer["policies"]:
            row = (f"<td>{layer['layer']}</td><td>{policy['policy']}</td>"
                   f"<td>{policy['mean_max_over_mean']:.4f}</td>")
            assert row in text


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.fail("no headless Chromium: the test command installs Debian's chromium (scripts/test_python.sh)")


def assert_chromium_renders_it(page, shot):
    """A headless Chromium's screenshot of the page is not blank."""
    subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1200,2400", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))  # rows x columns x channels, floats in [0, 1]
    assert pixels.shape[0] == 2400 and pixels.shape[1] == 1200
    rgb = pixels[..., :3]
    not_white = (rgb.min(axis=2) < 0.9).mean()
    # A blank (or failed-to-load) page is all white; the figures cover a
    # good part of this one.
    assert not_white > 0.05, f"only {not_white:.1%} of the screenshot is not white"
    assert rgb.std() > 0.1


def test_chromium_renders_the_report_to_a_screenshot_that_is_not_blank(training_page, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(training_page)
    assert_chromium_renders_it(page, tmp_path / "shot.png")


def test_the_main_commands_report_is_written_and_renders(tmp_path):
    """scripts/test_python.sh runs the main command (scripts/main.sh, a short
    run) before the tests and names its metrics directory here."""
    run_dir = os.environ.get("EPMOE_MAIN_RUN")
    if not run_dir:
        pytest.fail("EPMOE_MAIN_RUN is not set: scripts/test_python.sh runs scripts/main.sh first and sets it")
    page = Path(run_dir) / "report.html"
    assert page.is_file(), f"the main command wrote no {page}"
    assert os.path.getmtime(page) >= os.path.getmtime(Path(run_dir) / "metrics.jsonl"), "a stale report"
    images = check_page(page.read_text(), min_images=5)
    for expected in ("Loss and throughput", "Expert load", "Balance", "Where the step's time goes",
                     "Bytes per collective"):
        assert expected in [image["alt"] for image in images]
    assert_chromium_renders_it(page, tmp_path / "shot.png")


def test_epmoe_balance_report_draws_the_replay(run, tmp_path):
    out = tmp_path / "balance.html"
    environment = dict(os.environ, EPMOE_PYTHON=sys.executable)
    done = subprocess.run([EPMOE, "balance", "--loads", run["metrics"], "ranks=2", "slots=1", "window=4",
                           "period=4", "--report", str(out)], capture_output=True, text=True, env=environment)
    assert done.returncode == 0, done.stderr
    images = check_page(out.read_text(), min_images=2)
    assert any(image["alt"].startswith("Placement of the copies") for image in images)
    assert not list(tmp_path.glob("*.replay.json")), "the temporary replay file is removed"
    # Without the package the command says what it needs.
    environment["EPMOE_PYTHON"] = "/bin/false"
    done = subprocess.run([EPMOE, "balance", "--loads", run["metrics"], "ranks=2", "--report", str(tmp_path / "x.html")],
                          capture_output=True, text=True, env=environment)
    assert done.returncode == 2 and "needs the epmoe Python package" in done.stderr


# ------------------------------------------------------------- bad input --
# Each case: the files to write (name -> text or bytes) into a directory D,
# the arguments ({d}: D, {out}: the report to write, in D/out/), and what the
# one error line must say.

PHASE = {"name": "forward", "cat": "phase", "ph": "X", "ts": 0, "dur": 1, "pid": 0}


def jsonl(*records):
    return "".join(json.dumps(r) + "\n" for r in records)


def trace(**changes):
    event = {key: value for key, value in {**PHASE, **changes}.items() if value is not None}
    return json.dumps({"traceEvents": [PHASE, event]})


def replay(copies=((0, 0, 5),), **changes):
    policy = {"policy": "dynamic", "mean_max_over_mean": 1.0, "steps": [{"max_over_mean": 1.0, "copies": copies}]}
    value = {"num_experts": 16, "config": {"ranks": 2, "slots": 1}, "policies": [policy], **changes}
    return json.dumps({key: v for key, v in value.items() if v is not None})


METRICS = ["{d}/m.jsonl", "--out", "{out}"]
TRACED = ["{d}/m.jsonl", "--trace", "{d}/t.json", "--out", "{out}"]
BALANCE = ["--balance", "{d}/r.json", "--out", "{out}"]
GOOD = jsonl({"step": 1, "loss": 2.0})

BAD_INPUTS = [
    # metrics.jsonl
    ({"m.jsonl": jsonl({"step": 1, "loss": "abc"})}, METRICS, "m.jsonl:1: loss: must be a number, got a string"),
    ({"m.jsonl": b'{"step": 1}\n{"step": 2, "x": "\xff"}\n{"step": 3}\n'}, METRICS,
     "m.jsonl:2: the metrics file is not UTF-8 text (byte 0xff"),
    ({"m.jsonl": jsonl({"step": 1, "expert_counts": [[1, 2, 3]]}, {"step": 2, "expert_counts": [[1, 2]]})},
     METRICS, "m.jsonl:2: expert_counts[0]: 2 experts, where"),
    ({"m.jsonl": jsonl({"step": 1, "expert_counts": [[1, 2]]}, {"step": 2, "expert_counts": [[1, 2], [3, 4]]})},
     METRICS, "m.jsonl:2: expert_counts: 2 MoE layers, where"),
    ({"m.jsonl": jsonl({"loss": 1.0}, {"step": 2})}, METRICS, "m.jsonl:1: a metrics line must be an object with a 'step'"),
    ({"m.jsonl": jsonl([1, 2], {"step": 2})}, METRICS, "m.jsonl:1: a metrics line must be an object"),
    ({"m.jsonl": jsonl({"step": "1"})}, METRICS, "m.jsonl:1: step: must be an integer, got a string"),
    ({"m.jsonl": jsonl({"step": True})}, METRICS, "m.jsonl:1: step: must be an integer, got a boolean"),
    ({"m.jsonl": jsonl({"step": -1})}, METRICS, "m.jsonl:1: step: -1 is negative"),
    ({"m.jsonl": jsonl({"step": 1, "expert_counts": [[1, -3]]})}, METRICS, "expert_counts[0][1]: -3 is negative"),
    ({"m.jsonl": jsonl({"step": 1, "expert_counts": [[1, 1.5]]})}, METRICS,
     "expert_counts[0][1]: must be an integer, got a number 1.5"),
    ({"m.jsonl": jsonl({"step": 1, "expert_counts": [[1]] * 65})}, METRICS,
     "expert_counts: 65 MoE layers, more than the report draws (at most 64)"),
    ({"m.jsonl": jsonl({"step": 1, "expert_counts": [[0] * 4097]})}, METRICS,
     "expert_counts[0]: 4097 experts, more than the report draws (at most 4096)"),
    ({"m.jsonl": jsonl({"step": 1, "phase_seconds": [1, 2]})}, METRICS, "phase_seconds: must be an object, got an array"),
    ({"m.jsonl": jsonl({"step": 1, "phase_seconds": {"forward": "fast"}})}, METRICS,
     "phase_seconds.forward: must be a number"),
    ({"m.jsonl": jsonl({"step": 1, "bytes_sent": {"all_reduce": -5}})}, METRICS, "bytes_sent.all_reduce: -5 is less than 0"),
    ({"m.jsonl": jsonl({"step": 1, "modelled": {"per_rank": [{"compute_seconds": 1.0}]}})}, METRICS,
     "modelled.per_rank[0]: has no 'rank'"),
    ({"m.jsonl": jsonl({"step": 1, "modelled": {"step_seconds": "1"}})}, METRICS,
     "modelled.step_seconds: must be a number"),
    ({"m.jsonl": jsonl({"step": 1, "rank_load_max_over_mean_before": 1.5})}, METRICS,
     "rank_load_max_over_mean_before: must be an array, got a number 1.5"),
    ({"m.jsonl": '{"step": 1, "x": ' + "[" * 100000 + "]" * 100000 + "}\n" + GOOD}, METRICS,
     "m.jsonl:1: the metrics line nests arrays or objects deeper than the report reads"),
    ({"m.jsonl": '{"step": 1' + "0" * 5000 + "}\n" + GOOD}, METRICS, "m.jsonl:1: the metrics line is not JSON the report"),
    ({"m.jsonl": GOOD + "not json\n" + GOOD}, METRICS, "m.jsonl:2: the metrics line is not JSON (Expecting value"),
    ({"m.jsonl": "\n\n"}, METRICS, "m.jsonl: no step records"),
    ({"m.jsonl/x": GOOD}, METRICS, "m.jsonl: the metrics file must be a regular file, and this is a directory"),
    ({}, METRICS, "m.jsonl: cannot read the metrics file: No such file or directory"),
    # --trace
    ({"m.jsonl": GOOD, "t.json": trace(pid=None)}, TRACED, "t.json: traceEvents[1]: has no 'pid'"),
    ({"m.jsonl": GOOD, "t.json": trace(ts="0")}, TRACED, "t.json: traceEvents[1].ts: must be a number"),
    ({"m.jsonl": GOOD, "t.json": trace(dur=-1)}, TRACED, "t.json: traceEvents[1].dur: -1 is less than 0"),
    ({"m.jsonl": GOOD, "t.json": trace(pid=5000)}, TRACED,
     "t.json: traceEvents[1].pid: 5000 is more than the report draws (at most 1023)"),
    ({"m.jsonl": GOOD, "t.json": trace(name=7)}, TRACED, "t.json: traceEvents[1].name: must be a string"),
    ({"m.jsonl": GOOD, "t.json": b'{"traceEvents": ["\xfe"]}'}, TRACED, "t.json:1: the trace is not UTF-8 text"),
    ({"m.jsonl": GOOD, "t.json": "3"}, TRACED, "t.json: a Chrome trace is a list of events"),
    ({"m.jsonl": GOOD, "t.json": '{\n"traceEvents": [\n'}, TRACED, "t.json:3: the trace is not JSON"),
    # --balance
    ({"r.json": replay(copies=[[-1, 0, 5]])}, BALANCE, "policies[0].steps[0].copies[0][0] (expert): -1 is negative"),
    ({"r.json": replay(copies=[[0, -1, 5]])}, BALANCE, "policies[0].steps[0].copies[0][1] (rank): -1 is negative"),
    ({"r.json": replay(copies=[[16, 0, 5]])}, BALANCE,
     "copies[0][0] (expert): 16 is not an index below num_experts=16"),
    ({"r.json": replay(copies=[[0, 1]])}, BALANCE, "copies[0]: must be [expert, rank, tokens], got an array"),
    ({"r.json": replay(num_experts=100000, config={"ranks": 100000})}, BALANCE,
     "r.json: num_experts: 100000 is more than the report draws (at most 4096)"),
    ({"r.json": replay(config={"ranks": 100000})}, BALANCE,
     "r.json: config.ranks: 100000 is more than the report draws (at most 1024)"),
    ({"r.json": replay(num_experts=None)}, BALANCE, "r.json: the top level: has no 'num_experts'"),
    ({"r.json": replay(policies=None)}, BALANCE, "r.json: a balance replay has 'policies' (or 'layers'"),
    ({"r.json": replay(policies=[{"steps": []}])}, BALANCE, "r.json: policies[0]: has no 'policy'"),
    ({"r.json": "[]"}, BALANCE, "r.json: the top level: must be an object, got an array"),
    # arguments and --out
    ({"m.jsonl": GOOD}, ["{d}/m.jsonl", "--out", "{d}/out"], "/out: is a directory; name the HTML file"),
    ({"m.jsonl": GOOD}, ["{d}/m.jsonl", "--out", "{d}/missing/r.html"], "/missing does not exist"),
    ({"m.jsonl": GOOD}, ["{d}/m.jsonl"], "the following arguments are required: --out"),
    ({}, ["--out", "{out}"], "give either a metrics.jsonl or --balance REPLAY.json"),
    ({"r.json": replay()}, ["--balance", "{d}/r.json", "--trace", "{d}/r.json", "--out", "{out}"],
     "--trace goes with a metrics.jsonl, not with --balance"),
    ({"m.jsonl": GOOD}, METRICS + ["--bogus"], "unrecognized arguments: --bogus"),
]


def write_files(directory, files):
    for name, content in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())


def assert_refused(code, stdout, stderr, fragment, out_dir, before):
    assert code == 2
    assert stdout == ""
    lines = stderr.splitlines()
    assert len(lines) == 1, f"not one line: {stderr!r}"
    assert lines[0].startswith("epmoe.report: error: ") and fragment in lines[0], lines[0]
    assert sorted(os.listdir(out_dir)) == before, "nothing is written (no report, no partial file)"


@pytest.mark.parametrize("files,arguments,fragment", BAD_INPUTS, ids=lambda value: None)
def test_bad_input_is_one_line_exit_2_and_no_file(tmp_path, capsys, files, arguments, fragment):
    write_files(tmp_path, files)
    out_dir = tmp_path / "out"
    out_dir.mkdir(exist_ok=True)
    before = sorted(os.listdir(out_dir))
    code = report.main([a.format(d=tmp_path, out=out_dir / "report.html") for a in arguments])
    captured = capsys.readouterr()
    assert_refused(code, captured.out, captured.err, fragment, out_dir, before)


def test_a_file_larger_than_the_bound_is_refused_unread(tmp_path, capsys):
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.truncate(_report_input.MAX_INPUT_BYTES + 1)  # sparse: no disk, and never read
    (tmp_path / "out").mkdir()
    code = report.main([str(big), "--out", str(tmp_path / "out" / "r.html")])
    captured = capsys.readouterr()
    assert_refused(code, captured.out, captured.err, "big.jsonl: the metrics file is larger than the report reads "
                   "(256 MiB)", tmp_path / "out", [])


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_a_device_is_refused_without_reading(tmp_path, kind):
    """In a child with a deadline and 4 GiB of address space: before the
    bound, a FIFO blocked for ever and /dev/zero was read until the OOM killer."""
    if kind == "fifo":
        source = tmp_path / "metrics.jsonl"
        os.mkfifo(source)
    else:
        source = "/dev/zero"
    (tmp_path / "out").mkdir()

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    done = subprocess.run([sys.executable, "-m", "epmoe.report", str(source), "--out", str(tmp_path / "out" / "r.html")],
                          capture_output=True, text=True, timeout=120, preexec_fn=limit_memory)
    what = "a FIFO" if kind == "fifo" else "a character device"
    assert_refused(done.returncode, done.stdout, done.stderr,
                   f"{source}: the metrics file must be a regular file, and this is {what}", tmp_path / "out", [])
