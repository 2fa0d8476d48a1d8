"""python -m epmoe.report on a real short training run (and its trace and
balance replay): the HTML is well formed and self-contained, every figure
is a real PNG, and a headless Chromium renders the page to a screenshot
that is not blank."""

import base64
import html.parser
import json
import os
import shutil
import subprocess
import sys

import pytest

from epmoe import report

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


def test_training_report_is_well_formed_and_has_every_figure(run):
    text = report.training_report(run["metrics"], run["trace"])
    images = check_page(text, min_images=7)
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
    with pytest.raises(report.ReportError, match=r"bad.jsonl:2: not a JSON line"):
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


def test_chromium_renders_the_report_to_a_screenshot_that_is_not_blank(run, tmp_path):
    page, shot = tmp_path / "report.html", tmp_path / "shot.png"
    page.write_text(report.training_report(run["metrics"], run["trace"]))
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
