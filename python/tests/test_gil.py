"""epmoe releases the GIL while it computes: another Python thread runs during a long rebalance.

No timing threshold: the switch interval is set so high that a thread holding
the GIL is never asked to give it up. If rebalance_experts kept the GIL, the
main thread could not run before the worker's calls return, and the worker
would see `main_ran` unset after every call. With the GIL released, the main
thread runs during the first call that lasts longer than it takes to wake.
"""

import numpy as np
from conftest import assert_releases_the_gil, make_weight

import epmoe


def test_another_thread_runs_during_rebalance():
    # float32 and contiguous already: a conversion in the wrapper would let numpy release the GIL during its
    # cast, and the test would pass for numpy's release instead of epmoe's.
    weight = np.ascontiguousarray(np.tile(make_weight("zipf", 1, 256, seed=5), (400, 1)), dtype=np.float32)
    assert_releases_the_gil(lambda: epmoe.rebalance_experts(weight, 320, 8, 8, 64), 50, "rebalance_experts")
