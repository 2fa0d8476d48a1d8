"""epmoe.EpGroup and epmoe.MoeLayer per rank, ranks as Python threads of one
ThreadsWorld (one thread per rank); the same under mpirun is test_mpi.py.

* every case of per_rank_cases.py (both dispatchers, dedup, chunks, fp8
  tokens, replicas) at R = 1, 2, 3, 4 gives `epmoe layer ranks=R`'s bits on
  the same arrays (topology in per_rank_cases.py);
* ranks made with different E, top_k, H or dispatch are refused on every
  rank, naming the rank and the key, without a hang;
* a call out of order raises epmoe.UsageError naming the call, and the step
  still works afterwards;
* an array epmoe cannot read in place is a TypeError naming the argument;
* a rank that raises wakes the others at once (an AbortedError, not a 60 s
  timeout) and run_threads re-raises the root error;
* outputs follow the inputs' kind, or go into the caller's arrays;
* the GIL is released while a rank computes."""

import json
import os

import numpy as np
import pytest
from conftest import assert_releases_the_gil
from per_rank_cases import (CASES, DIMS, assemble, differences, epmoe_tool, generate_inputs, rank_share, run_rank,
                            run_tool)

import epmoe

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    directory = tmp_path_factory.mktemp("inputs")
    tool = epmoe_tool(REPO)
    return tool, directory, generate_inputs(tool, directory)


@pytest.mark.parametrize("num_ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("case", sorted(CASES))
def test_threads_ranks_give_epmoe_layers_bits(problem, tmp_path, case, num_ranks):
    tool, directory, arrays = problem
    keys = CASES[case]
    want = run_tool(tool, directory, tmp_path / "out", keys, num_ranks)
    parts = epmoe.run_threads(num_ranks,
                              lambda comm: run_rank(epmoe, comm, arrays, keys, num_ranks, comm.rank))
    assert differences(assemble(parts), want) == []


@pytest.mark.parametrize("case", ["replicas", "replicas_unpriced"])
def test_replica_stats_report_the_plan_and_its_price_as_epmoe_layer_does(problem, tmp_path, case):
    """last_step_stats() of every rank carries the replica plan's verdict
    (predicted saving and cost of what it placed and of what it refused, the
    rates it priced at) with the names and units of `epmoe layer`'s
    metrics.json "balance", and the same values: the plan is identical on
    every rank and in the tool."""
    tool, directory, arrays = problem
    keys = dict(CASES["replicas"], **({"replica_costs": "off"} if case == "replicas_unpriced" else {}))
    num_ranks = 3
    run_tool(tool, directory, tmp_path / "out", keys, num_ranks)
    with open(tmp_path / "out" / "metrics.json") as f:
        want = json.load(f)["balance"]

    def rank_main(comm):
        share = rank_share(arrays, comm.rank, num_ranks)
        group = epmoe.EpGroup(comm, num_experts=DIMS["num_experts"], top_k=keys["top_k"], hidden=DIMS["hidden"],
                              **{k: v for k, v in keys.items() if k != "top_k"})
        layer = epmoe.MoeLayer(group, ffn=DIMS["ffn"])
        layer.forward(share["x"], share["gate"], share["wi0"], share["wi1"], share["wo"])
        layer.backward(share["dy"])
        return layer.last_step_stats()

    names = ("num_replicas", "rank_loads_before", "rank_loads_after", "max_over_mean_before", "max_over_mean_after",
             "ideal_max_over_mean", "predicted_saving_us", "predicted_cost_us", "refused_replicas",
             "refused_saving_us", "refused_cost_us", "skipped_planning", "priced_at")
    for stats in epmoe.run_threads(num_ranks, rank_main):
        assert {n: stats[n] for n in names} == {n: want[n] for n in names}  # the same doubles, through JSON
    # The case is one where the verdict says something: priced, the plan
    # either placed replicas that pay or refused some that would not;
    # unpriced, it balanced at no price.
    if case == "replicas":
        assert want["priced_at"]["compute_gflops"] > 0
        assert (want["num_replicas"] > 0 and want["predicted_saving_us"] > want["predicted_cost_us"]) or \
            (want["refused_replicas"] > 0 and want["refused_cost_us"] >= want["refused_saving_us"])
    else:
        assert want["num_replicas"] > 0 and want["predicted_saving_us"] == 0 and want["priced_at"]["compute_gflops"] == 0


def test_a_single_rank_group_without_a_communicator_gives_ranks_1_bits(problem, tmp_path):
    tool, directory, arrays = problem
    want = run_tool(tool, directory, tmp_path / "out", {"top_k": 2}, 1)
    assert differences(assemble([run_rank(epmoe, None, arrays, {"top_k": 2}, 1, 0)]), want) == []


def make_layer(communicator=None, **keys):
    group = epmoe.EpGroup(communicator, num_experts=DIMS["num_experts"], top_k=2, hidden=DIMS["hidden"], **keys)
    return epmoe.MoeLayer(group, ffn=DIMS["ffn"])


def test_gemm_implementations_count_every_product_of_a_step_once(problem):
    """epmoe.gemm_implementations(): after a reset, one forward and backward
    of a single-rank layer show every product once under the implementation
    that ran it: the experts' 18·N·K·H·F FLOPs and the router's 6·N·H·E."""
    _, _, arrays = problem
    share = rank_share(arrays, 0, 1)
    layer = make_layer()
    epmoe.gemm_implementations(reset=True)
    layer.forward(share["x"], share["gate"], share["wi0"], share["wi1"], share["wo"])
    layer.backward(share["dy"])
    uses = epmoe.gemm_implementations(reset=True)
    assert uses and all(u["implementation"] and u["calls"] > 0 and u["compute_dtype"] == "f32" for u in uses)
    n, h, f, e, k = DIMS["num_tokens"], DIMS["hidden"], DIMS["ffn"], DIMS["num_experts"], 2
    assert sum(u["gflop"] for u in uses) == pytest.approx((18 * n * k * h * f + 6 * n * h * e) * 1e-9, rel=1e-12)
    assert epmoe.gemm_implementations() == []  # the reset zeroed them


def test_a_random_router_stream_decides_the_draws_whatever_the_layer_drew_before(problem):
    """random_router_stream (begin_forward and forward): the same stream gives
    the same expert ids on a used and a fresh layer; without one the layer's
    generator goes on."""
    _, _, arrays = problem
    share = rank_share(arrays, 0, 1)
    weights = [share[name] for name in ("x", "gate", "wi0", "wi1", "wo")]
    group = epmoe.EpGroup(None, num_experts=DIMS["num_experts"], top_k=2, hidden=DIMS["hidden"])
    used, fresh = (epmoe.MoeLayer(group, ffn=DIMS["ffn"], router="random") for _ in range(2))
    used.forward(*weights)
    step = used.begin_forward(*weights, random_router_stream=3)
    used.finish_forward(step)
    seven = used.forward(*weights, random_router_stream=7).topk_ids
    assert np.array_equal(fresh.forward(*weights, random_router_stream=7).topk_ids, seven)
    assert not np.array_equal(fresh.forward(*weights).topk_ids, seven)
    assert not np.array_equal(fresh.forward(*weights, random_router_stream=8).topk_ids, seven)
    step = fresh.begin_forward(*weights, weight_version=1, random_router_stream=7)
    assert np.array_equal(fresh.finish_forward(step).topk_ids, seven)


@pytest.mark.parametrize("differing, expected", [
    ({"top_k": 3}, "rank 1 has top_k=3 but rank 0 has top_k=2"),
    ({"num_experts": 6}, "rank 1 has num_experts=6 but rank 0 has num_experts=12"),
    ({"hidden": 16}, "rank 1 has hidden=16 but rank 0 has hidden=24"),
    ({"dispatch": "ring"}, "rank 1 has dispatch=ring but rank 0 has dispatch=alltoall"),
])
def test_ranks_made_with_different_keys_are_refused_on_every_rank(differing, expected):
    def rank_main(comm):
        settings = {"num_experts": DIMS["num_experts"], "top_k": 2, "hidden": DIMS["hidden"]}
        if comm.rank == 1:
            settings.update(differing)
        try:
            epmoe.EpGroup(comm, **settings)
        except ValueError as error:
            return str(error)
        return "accepted"

    for message in epmoe.run_threads(3, rank_main):
        assert expected in message


def test_calls_out_of_order_raise_usage_errors_naming_the_call(problem):
    _, _, arrays = problem
    share = rank_share(arrays, 0, 1)
    weights = [share[n] for n in ("gate", "wi0", "wi1", "wo")]
    layer, other = make_layer(), make_layer()
    with pytest.raises(epmoe.UsageError, match=r"MoeLayer.backward\(\): no forward\(\) step"):
        layer.backward(share["dy"])
    step = layer.begin_forward(share["x"], *weights)
    with pytest.raises(epmoe.UsageError, match=r"begin_backward\(\) out of order"):
        layer.begin_backward(step, share["dy"])
    with pytest.raises(epmoe.UsageError, match=r"finish_backward\(\) out of order"):
        layer.finish_backward(step)
    with pytest.raises(epmoe.UsageError, match=r"finish_forward\(\): on a step of another layer"):
        other.finish_forward(step)
    out = layer.finish_forward(step)
    with pytest.raises(epmoe.UsageError, match=r"finish_forward\(\) out of order"):
        layer.finish_forward(step)
    layer.begin_backward(step, share["dy"])
    grads = layer.finish_backward(step)
    assert not step.active
    with pytest.raises(epmoe.UsageError, match=r"finish_backward\(\) on a step that is not under way"):
        layer.finish_backward(step)
    # The refusals changed nothing: a fresh layer gives the same bits.
    fresh = make_layer()
    assert fresh.forward(share["x"], *weights).y.tobytes() == out.y.tobytes()
    assert fresh.backward(share["dy"]).dwo.tobytes() == grads.dwo.tobytes()

    group = layer.group
    d = group.dispatch(share["x"], out.topk_ids, out.topk_weights)
    expert_outputs = np.ones_like(d.rows)
    with pytest.raises(epmoe.UsageError, match=r"combine_backward\(\) out of order"):
        group.combine_backward(d.handle, share["dy"], expert_outputs)
    group.combine(d.handle, expert_outputs)
    with pytest.raises(epmoe.UsageError, match=r"combine\(\) out of order"):
        group.combine(d.handle, expert_outputs)
    gc = group.combine_backward(d.handle, share["dy"], expert_outputs)
    group.dispatch_backward(d.handle, gc.d_expert_outputs, gc.d_row_weights)
    with pytest.raises(epmoe.UsageError, match=r"dispatch_backward\(\) on an empty dispatch handle"):
        group.dispatch_backward(d.handle, gc.d_expert_outputs, gc.d_row_weights)
    with pytest.raises(epmoe.UsageError, match=r"another EP group"):
        other.group.combine(d.handle, expert_outputs)


def test_arrays_epmoe_cannot_read_in_place_are_refused_naming_the_argument(problem, torch_module):
    torch = torch_module
    _, _, arrays = problem
    s = rank_share(arrays, 0, 1)
    layer = make_layer()
    with pytest.raises(TypeError, match=r"begin_forward: x must be a C-contiguous float32 CPU array.*float64"):
        layer.begin_forward(s["x"].astype(np.float64), s["gate"], s["wi0"], s["wi1"], s["wo"])
    with pytest.raises(TypeError, match=r"begin_forward: wi1 is not C-contiguous"):
        layer.begin_forward(s["x"], s["gate"], s["wi0"], np.asfortranarray(s["wi1"]), s["wo"])
    with pytest.raises(TypeError, match=r"begin_forward: gate must be .*list"):
        layer.begin_forward(s["x"], s["gate"].tolist(), s["wi0"], s["wi1"], s["wo"])
    with pytest.raises(TypeError, match=r"begin_forward: wo must be a C-contiguous float32 CPU array.*device meta"):
        layer.begin_forward(s["x"], s["gate"], s["wi0"], s["wi1"], torch.from_numpy(s["wo"]).to("meta"))
    out = layer.forward(s["x"], s["gate"], s["wi0"], s["wi1"], s["wo"])
    with pytest.raises(TypeError, match=r"dispatch: topk_ids must be a C-contiguous int32"):
        layer.group.dispatch(s["x"], out.topk_ids.astype(np.int64), out.topk_weights)
    read_only = np.empty((DIMS["num_tokens"], DIMS["hidden"]), np.float32)
    read_only.flags.writeable = False
    with pytest.raises(TypeError, match=r"finish_backward: dx is read-only"):
        layer.begin_backward(layer._step, s["dy"])
        layer.finish_backward(layer._step, epmoe.Gradients(read_only, None, None, None, None))


def test_outputs_follow_the_inputs_kind_or_go_into_the_callers_arrays(problem, torch_module):
    torch = torch_module
    _, _, arrays = problem
    s = rank_share(arrays, 0, 1)
    names = ("x", "gate", "wi0", "wi1", "wo")
    out = make_layer().forward(*(s[n] for n in names))
    assert isinstance(out.y, np.ndarray) and out.topk_ids.dtype == np.int32

    layer = make_layer()
    got = layer.forward(*(torch.from_numpy(s[n]) for n in names))
    assert isinstance(got.y, torch.Tensor) and got.topk_ids.dtype == torch.int32
    assert got.y.numpy().tobytes() == out.y.tobytes()
    grads = layer.backward(torch.from_numpy(s["dy"]))
    assert all(isinstance(g, torch.Tensor) for g in grads)

    buffers = epmoe.ForwardOutput(np.full_like(out.y, np.nan), np.zeros_like(out.topk_ids),
                                  np.zeros_like(out.topk_weights))
    into = make_layer().forward(*(s[n] for n in names), out=buffers)
    assert all(a is b for a, b in zip(into, buffers))
    assert buffers.y.tobytes() == out.y.tobytes() and buffers.topk_ids.tobytes() == out.topk_ids.tobytes()


def test_a_failing_rank_wakes_the_others_and_its_error_is_raised(problem):
    _, _, arrays = problem

    def rank_main(comm):
        if comm.rank == 1:
            raise KeyError("rank 1 fails before its forward")
        run_rank(epmoe, comm, arrays, {"top_k": 2}, 3, comm.rank)  # waits for rank 1 in the dispatch

    with pytest.raises(KeyError, match="rank 1 fails before its forward"):
        epmoe.run_threads(3, rank_main)

    errors = []

    def record(comm):
        try:
            rank_main(comm)
        except epmoe.AbortedError as error:
            errors.append(str(error))
            raise

    with pytest.raises(KeyError):
        epmoe.run_threads(3, record)
    assert len(errors) == 2 and all("rank 1 failed: KeyError" in e for e in errors), errors


def test_the_gil_is_released_while_a_rank_computes():
    rng = np.random.default_rng(3)
    n, h, f, e = 512, 64, 64, 4
    x, dy = rng.standard_normal((n, h), dtype=np.float32), rng.standard_normal((n, h), dtype=np.float32)
    gate = rng.standard_normal((h, e), dtype=np.float32)
    wi0, wi1 = rng.standard_normal((e, h, f), dtype=np.float32), rng.standard_normal((e, h, f), dtype=np.float32)
    wo = rng.standard_normal((e, f, h), dtype=np.float32)
    layer = epmoe.MoeLayer(epmoe.EpGroup(None, num_experts=e, top_k=2, hidden=h), ffn=f)

    def step():
        layer.forward(x, gate, wi0, wi1, wo)
        layer.backward(dy)

    assert_releases_the_gil(step, 20, "the per-rank layer")


def test_keys_go_to_their_part_and_run_keys_are_refused():
    with pytest.raises(ValueError, match="compute_dtype=bf16 .*a key of the MoE layer, not of its EP group"):
        epmoe.EpGroup(None, num_experts=4, top_k=2, hidden=8, compute_dtype="bf16")
    with pytest.raises(ValueError, match="dispatch=ring .*a key of the EP group, not of an MoE layer on it"):
        epmoe.MoeLayer(epmoe.EpGroup(None, num_experts=4, top_k=2, hidden=8), ffn=8, dispatch="ring")
    with pytest.raises(ValueError, match="wire_dtype=fp16: expected one of auto, f32, bf16"):
        epmoe.EpGroup(None, num_experts=4, top_k=2, hidden=8, wire_dtype="fp16")
    with pytest.raises(ValueError, match="wire_dtype=bf16: a single-rank EP group moves no tokens"):
        epmoe.EpGroup(None, num_experts=4, top_k=2, hidden=8, wire_dtype="bf16")
    with pytest.raises(ValueError, match="ranks=2 .*describes a run, not a layer on a rank"):
        epmoe.EpGroup(None, num_experts=4, top_k=2, hidden=8, ranks=2)
    with pytest.raises(ValueError, match="top_k=3 but its EP group has top_k=2"):
        epmoe.MoeLayer(epmoe.EpGroup(None, num_experts=4, top_k=2, hidden=8), ffn=8, top_k=3)


def test_import_epmoe_imports_neither_torch_nor_mpi4py():
    import subprocess
    import sys

    code = "import sys, epmoe; print(sorted(m for m in ('torch', 'mpi4py') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True).stdout.strip() == "[]"
