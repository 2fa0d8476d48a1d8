"""epmoe.torch: the MoE layer as a torch.nn.Module per rank, and dispatch /
combine as autograd functions; ranks as Python threads (run_threads).

Topology: N = 40 tokens, H = 24, F = 20, E = 6 experts, K = 2, softmax over
the top-K logits; rank r of R holds token rows [r*N//R, (r+1)*N//R) and
experts [r*E/R, (r+1)*E/R). Reference: torch autograd of a plain torch MoE
in float64 on the whole problem; "within 1e-5" is max |got - want| /
max |want| per tensor (DESIGN.md §3), the ranks' outputs assembled first
(dx and the experts' gradients concatenated, the gate's summed).

* the module's y and gradients (x, gate, wi0, wi1, wo) at R = 1, 2, 3 are
  within 1e-5 of the reference; at R = 1 they are the per-rank numpy
  layer's bits;
* the backward uses the forward's step: it begins no forward;
* two forwards in flight before one backward (micro-batches) give both
  batches' gradients;
* dispatch / combine with a plain torch router and plain torch experts give
  y and every gradient within 1e-5 of the reference at R = 1, 2, 3;
* compute_dtype="bf16": within bf16's tolerance where the CPU has a bf16
  matmul, refused naming the key where it has none (lscpu flags decide
  which test runs).
"""

import subprocess

import numpy as np
import pytest

import epmoe

torch = pytest.importorskip("torch", reason="torch is not installed: epmoe.torch needs it")
import epmoe.torch  # noqa: E402  (after the skip)

N, H, F, E, K = 40, 24, 20, 6, 2
NAMES = ("x", "gate", "wi0", "wi1", "wo")


def problem(seed=5):
    rng = np.random.default_rng(seed)
    arrays = {"x": rng.standard_normal((N, H)), "gate": rng.standard_normal((H, E)) * H**-0.5,
              "wi0": rng.standard_normal((E, H, F)) * H**-0.5, "wi1": rng.standard_normal((E, H, F)) * H**-0.5,
              "wo": rng.standard_normal((E, F, H)) * F**-0.5, "dy": rng.standard_normal((N, H))}
    return {name: a.astype(np.float32) for name, a in arrays.items()}


def plain_torch_moe(x, gate, wi0, wi1, wo):
    """softmax over the top-K router logits (Mixtral/Qwen) and SwiGLU experts, in plain torch."""
    top_logits, top_ids = (x @ gate).topk(K, dim=1)
    weights = torch.softmax(top_logits, dim=1)
    y = torch.zeros_like(x)
    for k in range(K):
        for e in range(gate.shape[1]):
            rows = (top_ids[:, k] == e).nonzero().flatten()
            if len(rows):
                h = torch.nn.functional.silu(x[rows] @ wi0[e]) * (x[rows] @ wi1[e])
                y = y.index_add(0, rows, weights[rows, k:k + 1] * (h @ wo[e]))
    return y


def reference(arrays):
    """y and the gradients of sum(y * dy) by name, in float64."""
    leaves = {n: torch.from_numpy(arrays[n]).double().requires_grad_() for n in NAMES}
    y = plain_torch_moe(*(leaves[n] for n in NAMES))
    (y * torch.from_numpy(arrays["dy"]).double()).sum().backward()
    return {"y": y.detach(), **{n: leaves[n].grad for n in NAMES}}


def relative(got, want):
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def rows_of(rank, num_ranks):
    return slice(N * rank // num_ranks, N * (rank + 1) // num_ranks)


def experts_of(rank, num_ranks):
    return slice(rank * E // num_ranks, (rank + 1) * E // num_ranks)


def assemble(parts):
    """Rank results (dicts of y, x, gate, wi0, wi1, wo gradients) as the whole problem's."""
    full = {n: torch.cat([p[n] for p in parts]) for n in ("y", "x", "wi0", "wi1", "wo")}
    full["gate"] = sum(p["gate"] for p in parts)
    return full


def module_on_rank(group, arrays, rank, num_ranks, **keys):
    moe = epmoe.torch.MoeLayer(group, ffn=F, **keys)
    with torch.no_grad():
        moe.gate.copy_(torch.from_numpy(arrays["gate"]))
        for name in ("wi0", "wi1", "wo"):
            getattr(moe, name).copy_(torch.from_numpy(arrays[name][experts_of(rank, num_ranks)]))
    return moe


def run_module(comm, arrays, num_ranks, group_keys, layer_keys=None):
    rank = 0 if comm is None else comm.rank
    group = epmoe.EpGroup(comm, num_experts=E, top_k=K, hidden=H, **group_keys)
    moe = module_on_rank(group, arrays, rank, num_ranks, **(layer_keys or {}))
    x = torch.from_numpy(arrays["x"][rows_of(rank, num_ranks)]).requires_grad_()
    y = moe(x)
    (y * torch.from_numpy(arrays["dy"][rows_of(rank, num_ranks)])).sum().backward()
    return {"y": y.detach(), "x": x.grad, **{n: getattr(moe, n).grad for n in NAMES[1:]}}


@pytest.mark.parametrize("num_ranks, group_keys", [
    (1, {}),
    (2, {"dispatch": "ring"}),
    (3, {"dedup": True, "token_chunks": 2}),
])
def test_module_gradients_equal_plain_torch_autograd_in_double(num_ranks, group_keys):
    arrays = problem()
    if num_ranks == 1:
        got = assemble([run_module(None, arrays, 1, group_keys)])
    else:
        got = assemble(epmoe.run_threads(num_ranks, lambda comm: run_module(comm, arrays, num_ranks, group_keys)))
    want = reference(arrays)
    for name in ("y", *NAMES):
        assert got[name] is not None, f"{name} got no gradient"
        assert relative(got[name], want[name]) < 1e-5, name


def test_the_module_gives_the_per_rank_layers_bits():
    arrays = problem()
    got = run_module(None, arrays, 1, {})
    layer = epmoe.MoeLayer(epmoe.EpGroup(None, num_experts=E, top_k=K, hidden=H), ffn=F)
    out = layer.forward(*(arrays[n] for n in NAMES))
    grads = layer.backward(arrays["dy"])
    assert got["y"].numpy().tobytes() == out.y.tobytes()
    for name, want in zip(NAMES, grads):
        assert got[name].numpy().tobytes() == want.tobytes(), name


class CountingLayer:
    """The native layer with its step calls recorded: (name, the step it was given or returned)."""

    def __init__(self, native):
        self.native, self.calls = native, []

    def __getattr__(self, name):
        method = getattr(self.native, name)

        if name not in ("begin_forward", "finish_forward", "begin_backward", "finish_backward"):
            return method

        def call(*args):
            result = method(*args)
            self.calls.append((name, result if name == "begin_forward" else args[0]))
            return result

        return call


def test_the_backward_uses_the_forwards_step_and_begins_no_forward():
    arrays = problem()
    moe = module_on_rank(epmoe.EpGroup(None, num_experts=E, top_k=K, hidden=H), arrays, 0, 1)
    counting = moe.layer._layer = CountingLayer(moe.layer._layer)
    y = moe(torch.from_numpy(arrays["x"]).requires_grad_())
    assert [name for name, _ in counting.calls] == ["begin_forward", "finish_forward"]
    step = counting.calls[0][1]
    assert step.active
    phases = moe.layer.phase_seconds()
    y.sum().backward()
    assert [name for name, _ in counting.calls[2:]] == ["begin_backward", "finish_backward"], \
        "the backward began a forward"
    assert all(given is step for _, given in counting.calls) and not step.active
    after = moe.layer.phase_seconds()
    assert all(after[p] == phases[p] for p in ("route", "dispatch", "experts", "combine"))
    assert after["backward_experts"] > 0


def test_two_forwards_in_flight_before_one_backward():
    arrays = problem()
    other = problem(seed=9)
    second = {**arrays, "x": other["x"], "dy": other["dy"]}  # the same weights, another micro-batch

    def rank_main(comm):
        rank, size = comm.rank, comm.size
        moe = module_on_rank(epmoe.EpGroup(comm, num_experts=E, top_k=K, hidden=H), arrays, rank, size)
        xs = [torch.from_numpy(a["x"][rows_of(rank, size)]).requires_grad_() for a in (arrays, second)]
        ys = [moe(x) for x in xs]  # both steps in flight
        sum((y * torch.from_numpy(a["dy"][rows_of(rank, size)])).sum() for y, a in zip(ys, (arrays, second))).backward()
        return {"x": xs[0].grad, "x2": xs[1].grad, "wo": moe.wo.grad}

    parts = epmoe.run_threads(2, rank_main)
    first_want, second_want = reference(arrays), reference(second)
    assert relative(torch.cat([p["x"] for p in parts]), first_want["x"]) < 1e-5
    assert relative(torch.cat([p["x2"] for p in parts]), second_want["x"]) < 1e-5
    assert relative(torch.cat([p["wo"] for p in parts]), first_want["wo"] + second_want["wo"]) < 1e-5


def run_dispatch_combine(comm, arrays, num_ranks):
    """A plain torch router and plain torch SwiGLU experts around epmoe.torch.dispatch / combine."""
    rank = 0 if comm is None else comm.rank
    group = epmoe.EpGroup(comm, num_experts=E, top_k=K, hidden=H)
    experts = experts_of(rank, num_ranks)
    gate = torch.from_numpy(arrays["gate"]).requires_grad_()
    wi0, wi1, wo = (torch.from_numpy(arrays[n][experts]).requires_grad_() for n in ("wi0", "wi1", "wo"))
    x = torch.from_numpy(arrays["x"][rows_of(rank, num_ranks)]).requires_grad_()
    top_logits, top_ids = (x @ gate).topk(K, dim=1)
    d = epmoe.torch.dispatch(group, x, top_ids.int(), torch.softmax(top_logits, dim=1))
    outputs, first = [], 0
    for e, count in enumerate(d.num_rows_per_expert.tolist()):
        rows = d.rows[first:first + count]
        outputs.append((torch.nn.functional.silu(rows @ wi0[e]) * (rows @ wi1[e])) @ wo[e])
        first += count
    y = epmoe.torch.combine(group, d.handle, torch.cat(outputs), d.row_weights)
    (y * torch.from_numpy(arrays["dy"][rows_of(rank, num_ranks)])).sum().backward()
    return {"y": y.detach(), "x": x.grad, "gate": gate.grad, "wi0": wi0.grad, "wi1": wi1.grad, "wo": wo.grad}


@pytest.mark.parametrize("num_ranks", [1, 2, 3])
def test_dispatch_and_combine_with_torch_experts_equal_plain_torch_autograd_in_double(num_ranks):
    arrays = problem()
    if num_ranks == 1:
        got = assemble([run_dispatch_combine(None, arrays, 1)])
    else:
        got = assemble(epmoe.run_threads(num_ranks, lambda comm: run_dispatch_combine(comm, arrays, num_ranks)))
    want = reference(arrays)
    for name in ("y", *NAMES):
        assert relative(got[name], want[name]) < 1e-5, name


def test_tensors_epmoe_cannot_read_are_refused_naming_the_argument():
    moe = epmoe.torch.MoeLayer(epmoe.EpGroup(None, num_experts=E, top_k=K, hidden=H), ffn=F)
    with pytest.raises(TypeError, match=r"begin_forward: x must be a C-contiguous float32 CPU array.*float64"):
        moe(torch.zeros(N, H, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"dispatch: topk_ids must be a C-contiguous int32"):
        epmoe.torch.dispatch(moe.group, torch.zeros(N, H), torch.zeros(N, K, dtype=torch.int64), torch.zeros(N, K))


def cpu_flags():
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return set()
    return set(next((line.split(":", 1)[1] for line in text.splitlines() if line.startswith("Flags")), "").split())


FLAGS = cpu_flags()
HAS_BF16_MATMUL = bool(FLAGS & {"avx512_bf16", "amx_bf16"})
HAS_NO_BF16_MATMUL = not FLAGS & {"avx512f", "amx_bf16"}  # oneDNN's bf16 needs AVX-512 at least


@pytest.mark.skipif(not HAS_BF16_MATMUL, reason="lscpu shows neither avx512_bf16 nor amx_bf16: oneDNN has no bf16 "
                                                "matmul on this CPU, so compute_dtype=bf16 cannot run here")
def test_bf16_compute_is_within_bf16_tolerance_of_the_double_reference():
    arrays = problem()
    got = assemble([run_module(None, arrays, 1, {}, {"compute_dtype": "bf16"})])
    want = reference(arrays)
    for name in ("y", *NAMES):
        assert relative(got[name], want[name]) < 3e-2, name  # bf16 operands: 8 bits of mantissa


@pytest.mark.skipif(not HAS_NO_BF16_MATMUL, reason="lscpu shows AVX-512 or AMX: oneDNN may have a bf16 matmul "
                                                   "here, so the refusal does not apply")
def test_bf16_is_refused_naming_the_key_where_the_cpu_has_no_bf16_matmul():
    with pytest.raises(ValueError, match="compute_dtype=bf16: oneDNN has no bf16 matmul on this CPU"):
        epmoe.torch.MoeLayer(epmoe.EpGroup(None, num_experts=E, top_k=K, hidden=H), ffn=F, compute_dtype="bf16")
