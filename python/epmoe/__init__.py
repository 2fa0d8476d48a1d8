"""epmoe from Python: the expert-parallel MoE layer and its load balancing.

Per rank, inside the caller's own process (under ``mpirun -np R python ...``,
or R threads of one process):

* ``mpi_communicator(comm)`` / ``ThreadsWorld(R).communicator(r)`` /
  ``run_threads(R, fn)``: a rank's end of the ranks' transport;
* ``EpGroup(communicator, num_experts, top_k, hidden, **keys)``: one rank's
  member of an expert-parallel group (exchange buffers shared by every
  layer), and dispatch / combine without the experts;
* ``MoeLayer(group, ffn, **keys)``: one rank's MoE layer, forward and
  backward, split phase, outputs into the caller's arrays;
* ``epmoe.torch``: ``MoeLayer``, a torch.nn.Module whose expert weights are
  this rank's Parameters, and ``dispatch`` / ``combine`` as autograd
  functions.

The whole problem in one call:

* ``WholeWorldLayer(**keys)``: the layer on the unsharded arrays, expert
  parallel over rank threads inside the call (`epmoe layer`'s run, bits);

Load balancing and reports:

* ``rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus)``:
  DeepSeek EPLB's function, same arguments and outputs, in C++ (the GIL is
  released while it runs), never two copies of one expert on one GPU where
  the slots allow it; where EPLB asserts, ``EplbAssertionError``.
* ``plan_replicas(counts, ranks, slots)``: epmoe's per-step replica planner.
* ``plan(**keys)``: what ``epmoe plan --json`` prints, as a dict.
* ``replay_balance(loads, **keys)``: what ``epmoe balance --loads --json``
  computes on loads [steps, E], as a dict.
* ``gemm_implementations(reset=False)``: which implementation ran this
  process's products (oneDNN's ``gemm:jit`` on AVX2,
  ``brg:avx512_core_amx...`` where AMX kernels ran, ``epmoe:few_rows`` for
  an expert's forward with 1-4 rows), with their calls and GFLOP.
* ``python -m epmoe.report``: a run's metrics (and trace) or a balance replay
  drawn into one self-contained HTML file.

numpy arrays in give numpy arrays out; torch tensors in give torch tensors
out (neither torch nor mpi4py is imported by ``import epmoe``). Bad
arguments raise TypeError or ValueError naming the argument; a call out of
its order raises epmoe.UsageError naming the call; a failed or late peer
epmoe.PeerError (epmoe.AbortedError when the failure was another rank's).
"""

from __future__ import annotations

import json
import operator
import sys

import numpy as np

from . import _epmoe
from ._arguments import key_text, torch_tensor_module
from ._epmoe import AbortedError, EplbAssertionError, PeerError, UsageError
from .communicators import Communicator, ThreadsWorld, mpi_communicator, run_threads, set_compute_threads
from .ep_group import CombineGradients, Dispatched, DispatchGradients, DispatchHandle, EpGroup
from .moe_layer import ForwardOutput, Gradients, MoeLayer, MoeStep
from .whole_world_layer import WholeWorldLayer

__all__ = [
    "Communicator", "ThreadsWorld", "run_threads", "mpi_communicator", "set_compute_threads",
    "EpGroup", "DispatchHandle", "Dispatched", "CombineGradients", "DispatchGradients",
    "MoeLayer", "MoeStep", "ForwardOutput", "Gradients",
    "WholeWorldLayer",
    "UsageError", "PeerError", "AbortedError", "EplbAssertionError",
    "rebalance_experts", "plan_replicas", "plan", "replay_balance", "gemm_implementations",
]
__version__ = "0.1.0"

_INT32_MAX = 2**31 - 1


def _integer(name, value, minimum=None):
    if type(value) is int and (minimum is None or value >= minimum) and value <= _INT32_MAX:
        return value
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected an integer, got bool {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__} {value!r}") from None
    if minimum is not None and number < minimum:
        raise ValueError(f"{name}={number}: must be >= {minimum}")
    if number > _INT32_MAX:
        raise ValueError(f"{name}={number}: must be at most {_INT32_MAX}")
    return number


def _numeric_array(name, value, ndim, shape_text):
    """(numpy array, torch module or None) for an array-like `value` of numbers."""
    torch = torch_tensor_module(value)
    if torch is not None:
        array = value.detach().cpu().numpy()
    else:
        if isinstance(value, (str, bytes, dict)) or value is None:
            raise TypeError(f"{name}: expected a numpy array or torch tensor {shape_text}, got {type(value).__name__}")
        try:
            array = np.asarray(value)
        except (TypeError, ValueError) as error:
            raise TypeError(f"{name}: expected a numpy array or torch tensor {shape_text}: {error}") from None
    if array.dtype.kind not in "iuf":
        raise TypeError(f"{name}: expected numbers {shape_text}, got dtype {array.dtype}")
    if array.ndim != ndim:
        raise ValueError(f"{name}: expected {shape_text}, got shape {list(array.shape)}")
    for size in array.shape:
        if size > _INT32_MAX:
            raise ValueError(f"{name}: shape {list(array.shape)} has a dimension above {_INT32_MAX}")
    return array, torch


def _as_int64(name, array):
    if array.dtype.kind == "f":
        if not np.all(np.isfinite(array)) or np.any(array != np.floor(array)):
            raise ValueError(f"{name}: expected integer token counts, got non-integer values")
    return np.ascontiguousarray(array, dtype=np.int64)


def rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus):
    """EPLB's rebalance_experts: place num_replicas expert copies on num_gpus GPUs.

    weight: [layers, logical experts] loads (numpy array, torch tensor or nested
    lists), >= 0. The hierarchical policy (groups packed onto nodes, copies onto
    the node's GPUs) when num_groups % num_nodes == 0, else the global one.

    Returns (physical_to_logical [L, num_replicas], logical_to_physical
    [L, E, num_replicas - E + 1] padded with -1, logical_count [L, E]), int64,
    numpy arrays for a numpy (or list) weight, torch tensors on weight's device
    for a torch weight. GPU g holds physical slots [g*P/G, (g+1)*P/G); no GPU
    holds two copies of one expert, unless it has more slots than its node has
    experts (then EPLB's placement); a hotter expert has at least as many
    copies as a colder one of its node where that costs no balance.

    Accepts every call DeepSeek's EPLB accepts (the global policy uses neither
    num_groups nor num_nodes). Where EPLB asserts (num_replicas not a multiple
    of num_gpus or below E; hierarchical: num_groups not dividing E, num_gpus
    not a multiple of num_nodes) raises EplbAssertionError, both an
    AssertionError and a ValueError; other bad arguments ValueError or TypeError.
    """
    # A rebalance is a few microseconds of C++ (docs/BENCHMARKS.md), so the
    # common cases skip the general conversion: a C-contiguous float32 numpy
    # array goes in as it is, a CPU torch tensor through .numpy() (no copy).
    torch = torch_tensor_module(weight)
    array = on_cpu = None
    if torch is None:
        array = weight
    else:
        try:
            array = on_cpu = weight.numpy()  # raises for a tensor needing grad or not on the CPU
        except (TypeError, RuntimeError):
            pass
    if not (type(array) is np.ndarray and array.dtype == np.float32 and array.ndim == 2 and array.flags.c_contiguous):
        array, torch = _numeric_array("weight", weight, 2, "[layers, experts]")
        # EPLB's arithmetic: loads as float32.
        array = np.ascontiguousarray(array, dtype=np.float32)
    outputs = _epmoe.rebalance_experts(
        array,
        # Below E (0 and negative included) is one of EPLB's asserts: the C++ says so.
        _integer("num_replicas", num_replicas, -_INT32_MAX),
        _integer("num_groups", num_groups, 1),
        _integer("num_nodes", num_nodes, 1),
        _integer("num_gpus", num_gpus, 1),
    )
    if torch is None:
        return outputs
    if on_cpu is not None:
        return tuple(torch.from_numpy(out) for out in outputs)
    return tuple(torch.from_numpy(out).to(weight.device) for out in outputs)


def plan_replicas(counts, ranks, slots, rebalance_threshold=1.0):
    """epmoe's per-step replica planner (balance/replica_planner.h).

    counts: [E] (token, k) pairs per expert this step, ints >= 0; experts homed
    contiguously (expert e on rank e // (E // ranks)); `slots` replica slots per
    rank. Returns the copies as a list of (expert, rank, quota) by expert, each
    expert's home first then its replicas by rank; an expert's quotas sum to its
    count.
    """
    array, _ = _numeric_array("counts", counts, 1, "[experts]")
    threshold = float(rebalance_threshold) if not isinstance(rebalance_threshold, bool) else None
    if threshold is None:
        raise TypeError("rebalance_threshold: expected a number, got bool")
    return _epmoe.plan_replicas(
        _as_int64("counts", array), _integer("ranks", ranks), _integer("slots", slots), threshold
    )


def _keys(keys):
    return [(name, key_text(name, value)) for name, value in keys.items()]


def plan(**keys):
    """What `epmoe plan --json key=value ...` prints, as a dict (a list with sweep=).

    Keys as `epmoe plan --help` lists them; names with a dot (remat.*) through
    plan(**{"remat.mlpwi": "save"}). Unknown keys and bad values raise
    ValueError naming the key.
    """
    return json.loads(_epmoe.plan_json(_keys(keys)))


def replay_balance(loads, **keys):
    """What `epmoe balance --loads FILE --json` computes on loads [steps, E], as a dict.

    loads: int counts per step and expert (numpy array, torch tensor or lists).
    Keys as `epmoe balance --help` lists them (ranks, slots, policy, window,
    period, rebalance_threshold, hidden, ffn, plans). Returns num_steps,
    num_experts, expert_weight_bytes, config and "policies": one dict per
    policy with its summary and, with plans=True (the default), every step's
    copies [expert, rank, quota] and weight moves [rank, expert].
    """
    array, _ = _numeric_array("loads", loads, 2, "[steps, experts]")
    return json.loads(_epmoe.replay_balance_json(_as_int64("loads", array), _keys(keys)))


def gemm_implementations(reset=False):
    """Which implementation ran this process's GEMMs since it started (or the
    last ``reset=True``): a list of dicts ``{"implementation", "compute_dtype",
    "calls", "gflop"}``, most GFLOP first. The implementation is oneDNN's own
    name for the kernel it picked ("gemm:jit" for every f32 product on AVX2;
    "brg:avx512_core_amx..." where its AMX kernels ran), "epmoe:few_rows"
    for f32 forward products of 1-4 rows (kernels/few_rows_gemm.h), or
    "openblas" with EPMOE_F32_GEMM=openblas. ``reset=True`` zeroes the counts after reading
    them, so that the next call covers what ran in between."""
    return _epmoe.gemm_implementations(bool(reset))
