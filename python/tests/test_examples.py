"""examples/torch_moe_lm: the PyTorch MoE language model trains with the
same per-step losses in one process (every expert local) and under
`mpirun -np 4` (E/4 experts per rank): within 1e-6 relative at each of 30
steps. The largest difference is printed (pytest -s shows it)."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch is not installed: the example needs it")
pytest.importorskip("mpi4py", reason="mpi4py is not installed (scripts/test_python.sh installs python3-mpi4py)")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(REPO, "examples", "torch_moe_lm", "train.py")


def train(tmp_path, num_ranks):
    losses = tmp_path / f"losses_{num_ranks}.txt"
    command = [sys.executable, TRAIN, "--steps", "30", "--losses", str(losses)]
    if num_ranks > 1:
        if shutil.which("mpirun") is None:
            pytest.fail("mpirun is not installed (scripts/setup.sh installs openmpi-bin)")
        command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(num_ranks),
                   *command]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("loss") >= 30, run.stdout
    return np.loadtxt(losses)


def test_mpirun_4_ranks_train_with_the_losses_of_one_process(tmp_path):
    one, four = train(tmp_path, 1), train(tmp_path, 4)
    assert one.shape == four.shape == (30,)
    assert one[-1] < one[0] - 1.0, f"the model did not learn: {one}"
    difference = np.abs(four - one) / np.abs(one)
    print(f"\nlargest relative difference of the per-step losses, -np 4 vs one process: {difference.max():.3g}")
    assert difference.max() < 1e-6, difference
