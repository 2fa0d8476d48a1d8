"""Shared helpers: load generators and the placement checks."""

import numpy as np
import pytest


def make_weight(kind, layers, experts, seed):
    """[layers, experts] loads: random, Zipf (s = 1.2, shuffled ranks) or adversarial (one or two hot experts)."""
    rng = np.random.default_rng(seed)
    if kind == "random":
        return rng.integers(0, 1000, size=(layers, experts)).astype(np.int64)
    ranks = np.stack([rng.permutation(experts) for _ in range(layers)])
    if kind == "zipf":
        return np.floor(100000.0 / (1.0 + ranks) ** 1.2).astype(np.int64)
    if kind == "adversarial":
        hot = np.where(ranks == 0, 100000, 0)
        hot[1::2] = np.where(ranks[1::2] < 2, 50000, rng.integers(0, 3, size=ranks[1::2].shape))
        return hot.astype(np.int64)
    raise ValueError(kind)


def check_placement(weight, outputs, num_replicas, num_gpus):
    """Asserts the EPLB contract and epmoe's rule (no expert twice on one GPU); returns max/mean per layer."""
    phy2log, log2phy, logcnt = (np.asarray(o) for o in outputs)
    layers, experts = np.asarray(weight).shape
    assert phy2log.shape == (layers, num_replicas)
    assert log2phy.shape == (layers, experts, num_replicas - experts + 1)
    assert logcnt.shape == (layers, experts)
    assert phy2log.dtype == log2phy.dtype == logcnt.dtype == np.int64
    slots = num_replicas // num_gpus
    ratios = []
    for layer in range(layers):
        row = phy2log[layer]
        assert row.min() >= 0 and row.max() < experts
        assert (logcnt[layer] >= 1).all(), "an expert without a copy"
        assert logcnt[layer].sum() == num_replicas
        np.testing.assert_array_equal(np.bincount(row, minlength=experts), logcnt[layer])
        for e in range(experts):
            copies = log2phy[layer, e]
            held = copies[: logcnt[layer, e]]
            assert (copies[logcnt[layer, e] :] == -1).all()
            np.testing.assert_array_equal(np.sort(held), np.flatnonzero(row == e))
        per_gpu = row.reshape(num_gpus, slots)
        for gpu in range(num_gpus):
            assert len(set(per_gpu[gpu].tolist())) == slots, f"layer {layer}: an expert twice on GPU {gpu}"
        share = np.asarray(weight, dtype=np.float64)[layer] / logcnt[layer]
        loads = share[row].reshape(num_gpus, slots).sum(axis=1)
        ratios.append(loads.max() / loads.mean() if loads.mean() > 0 else 1.0)
    return ratios


@pytest.fixture
def torch_module():
    try:
        import torch
    except Exception as error:  # not installed, or a wheel that cannot load here
        pytest.skip(f"torch is not importable ({error}); the torch-in/torch-out cases need it")
    return torch


def assert_releases_the_gil(call, repeats, what):
    """Runs call() up to `repeats` times on a worker thread and asserts that
    the main thread ran meanwhile. No timing: with a huge switch interval a
    thread holding the GIL is never asked to give it up, so the main thread
    can run during the worker's calls only if a call released the GIL."""
    import sys
    import threading

    started, main_ran, done = threading.Event(), threading.Event(), threading.Event()
    observed = []

    def worker():
        started.set()
        for _ in range(repeats):
            call()
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
    assert observed == [True], f"the main thread never ran while {what} computed: the GIL was held"
