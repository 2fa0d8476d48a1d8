"""The per-rank API under mpirun: one process per rank, each on
epmoe.mpi_communicator(MPI.COMM_WORLD) (mpi4py), the ranks' scripts in
mpi_ranks.py.

* every case of per_rank_cases.py at R = 1, 2, 3, 4 gives `epmoe layer
  ranks=R`'s bits on the same arrays (topology in per_rank_cases.py);
* a rank that raises (uncaught, in its main thread or in a worker thread)
  ends every rank at once, through the excepthooks mpi_communicator
  installs and MPI_Abort: the job ends well
  before the group's 60 s timeout, and stderr names the failing rank and
  its error. The measured time is printed (pytest -s shows it).
"""

import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from per_rank_cases import CASES, assemble, differences, epmoe_tool, generate_inputs, run_tool

pytest.importorskip("mpi4py", reason="mpi4py is not installed (scripts/test_python.sh installs python3-mpi4py)")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANKS_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_ranks.py")


def mpirun(num_ranks, *arguments, timeout):
    if shutil.which("mpirun") is None:
        pytest.fail("mpirun is not installed (scripts/setup.sh installs openmpi-bin)")
    command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(num_ranks),
               sys.executable, RANKS_SCRIPT, *arguments]
    # OpenMP threads: the ranks share this machine's cores as `epmoe layer
    # ranks=R` shares them among its rank threads (max(1, cores / R) each),
    # so that priced replica plans, which depend on the compute threads,
    # are the tool's.
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // num_ranks))}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=os.path.dirname(RANKS_SCRIPT))


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    directory = tmp_path_factory.mktemp("inputs")
    tool = epmoe_tool(REPO)
    return tool, directory, generate_inputs(tool, directory)


@pytest.mark.parametrize("num_ranks", [1, 2, 3, 4])
def test_mpirun_ranks_give_epmoe_layers_bits(problem, tmp_path, num_ranks):
    tool, directory, _ = problem
    out = tmp_path / "ranks"
    out.mkdir()
    run = mpirun(num_ranks, "bits", str(directory), str(out), timeout=120)
    assert run.returncode == 0, run.stderr
    for case, keys in CASES.items():
        parts = []
        for rank in range(num_ranks):
            with np.load(out / f"{case}.rank{rank}.npz") as part:
                parts.append(dict(part))
        want = run_tool(tool, directory, tmp_path / case, keys, num_ranks)
        assert differences(assemble(parts), want) == [], case


@pytest.mark.parametrize("where", ["main thread", "worker thread"])
def test_a_rank_that_raises_ends_every_rank_at_once(tmp_path, where):
    marker = tmp_path / "raised_at"
    run = mpirun(3, "fail" if where == "main thread" else "fail_in_thread", str(marker), timeout=120)
    ended = time.time()
    assert run.returncode != 0
    assert marker.exists(), run.stderr
    seconds = ended - float(marker.read_text())
    print(f"\nrank 1 raised in its {where}; mpirun -np 3 ended {seconds:.3f} s later")
    assert "epmoe: rank 1: failed: RuntimeError: rank 1 fails on purpose after its first step" in run.stderr
    if where == "worker thread":
        assert "in thread 'steps'" in run.stderr, run.stderr
    # The other ranks wait for rank 1 in their second step: without the
    # abort they would end only at the group's 60 s timeout.
    assert seconds < 10, run.stderr
