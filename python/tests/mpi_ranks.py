"""One rank of test_mpi.py's runs under mpirun (not a test itself):

    mpirun -np R python mpi_ranks.py bits IN_DIR OUT_DIR
        every case of per_rank_cases.py on this rank, through
        epmoe.mpi_communicator(MPI.COMM_WORLD); rank r writes its outputs to
        OUT_DIR/<case>.rank<r>.npz for the test to assemble.
    mpirun -np R python mpi_ranks.py fail MARKER
        steps of a small layer; rank 1 raises after its first step (having
        written the time to MARKER), uncaught, while the others wait for it
        in their second step's dispatch.
    mpirun -np R python mpi_ranks.py fail_in_thread MARKER
        the same, with every rank's steps in a worker thread that the main
        thread joins: rank 1's worker raises, uncaught, and its main thread
        would go on to exit normally.
"""

import os
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

import epmoe
from per_rank_cases import ARRAYS, CASES, run_rank


def bits(in_directory, out_directory):
    arrays = {name: np.load(os.path.join(in_directory, f"{name}.npy")) for name in (*ARRAYS, "dy")}
    comm = epmoe.mpi_communicator(MPI.COMM_WORLD)
    for case, keys in CASES.items():
        outputs = run_rank(epmoe, comm, arrays, keys, comm.size, comm.rank)
        np.savez(os.path.join(out_directory, f"{case}.rank{comm.rank}.npz"), **outputs)


def fail(marker):
    layer_steps_that_fail_on_rank_1(marker)


def fail_in_thread(marker):
    worker = threading.Thread(target=layer_steps_that_fail_on_rank_1, args=(marker,), name="steps")
    worker.start()
    worker.join()


def layer_steps_that_fail_on_rank_1(marker):
    num_experts = 2 * MPI.COMM_WORLD.size
    group = epmoe.EpGroup(MPI.COMM_WORLD, num_experts=num_experts, top_k=2, hidden=8)
    layer = epmoe.MoeLayer(group, ffn=8)
    rng = np.random.default_rng(group.rank)
    x, dy = rng.standard_normal((6, 8), dtype=np.float32), rng.standard_normal((6, 8), dtype=np.float32)
    gate = rng.standard_normal((8, num_experts), dtype=np.float32)
    local = group.num_local_experts
    wi0, wi1 = rng.standard_normal((local, 8, 8), dtype=np.float32), rng.standard_normal((local, 8, 8), dtype=np.float32)
    wo = rng.standard_normal((local, 8, 8), dtype=np.float32)
    for step in range(100):
        layer.forward(x, gate, wi0, wi1, wo)
        layer.backward(dy)
        if group.rank == 1 and step == 0:
            with open(marker, "w") as f:
                f.write(repr(time.time()))
            raise RuntimeError("rank 1 fails on purpose after its first step")


if __name__ == "__main__":
    {"bits": bits, "fail": fail, "fail_in_thread": fail_in_thread}[sys.argv[1]](*sys.argv[2:])
