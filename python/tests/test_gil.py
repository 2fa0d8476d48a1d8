"""epmoe releases the GIL while it computes: another Python thread runs during a long rebalance.

No timing threshold: the switch interval is set so high that a thread holding
the GIL is never asked to give it up. If rebalance_experts kept the GIL, the
main thread could not run before the worker's calls return, and the worker
would see `main_ran` unset after every call. With the GIL released, the main
thread runs during the first call that lasts longer than it takes to wake.
"""

import sys
import threading

import numpy as np
from conftest import make_weight

import epmoe


def test_another_thread_runs_during_rebalance():
    # float32 and contiguous already: a conversion in the wrapper would let numpy release the GIL during its
    # cast, and the test would pass for numpy's release instead of epmoe's.
    weight = np.ascontiguousarray(np.tile(make_weight("zipf", 1, 256, seed=5), (400, 1)), dtype=np.float32)
    started, main_ran, done = threading.Event(), threading.Event(), threading.Event()
    observed = []

    def worker():
        started.set()
        for _ in range(50):
            epmoe.rebalance_experts(weight, 320, 8, 8, 64)
            if main_ran.is_set():
                observed.append(True)
                break
        done.set()

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        thread = threading.Thread(target=worker)
        thread.start()
        started.wait()
        main_ran.set()  # runs only once this thread holds the GIL
        done.wait()
        thread.join()
    finally:
        sys.setswitchinterval(previous)
    assert observed == [True], "the main thread never ran while rebalance_experts computed: the GIL was held"
