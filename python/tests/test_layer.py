"""epmoe.WholeWorldLayer: the whole-world layer from Python (R rank threads
inside each call; the per-rank layer is test_per_rank_layer.py).

* through Python it gives `epmoe layer`'s bits on the same .npy files;
* numpy in gives numpy out, torch in gives torch out;
* bad arguments raise TypeError / ValueError naming the argument;
* trace_file= writes each call's trace (or is refused up front), and
  fault_injection= fails only the layer given it;
* the GIL is released while the ranks compute."""

import json
import os
import subprocess

import numpy as np
import pytest
from conftest import assert_releases_the_gil

import epmoe

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EPMOE = os.environ.get("EPMOE_BINARY", os.path.join(REPO, "build", "epmoe"))
ARRAYS = ("x", "gate", "wi0", "wi1", "wo")
OUTPUTS = ("y", "topk_ids", "topk_weights", "dx", "dgate", "dwi0", "dwi1", "dwo")


def tool():
    if not os.access(EPMOE, os.X_OK):
        pytest.fail(f"the epmoe tool is not built at {EPMOE} (set EPMOE_BINARY or build the project)")
    return EPMOE


def inputs(tmp_path, **dims):
    directory = tmp_path / "in"
    keys = [f"{k}={v}" for k, v in {"num_tokens": 40, "hidden": 24, "ffn": 20, "num_experts": 6, "seed": 5,
                                     **dims}.items()]
    subprocess.run([tool(), "gen-inputs", "--out", str(directory), *keys], check=True, capture_output=True)
    return directory, {name: np.load(directory / f"{name}.npy") for name in (*ARRAYS, "dy")}


@pytest.mark.parametrize("keys", [
    {"ranks": 2, "top_k": 2},
    {"ranks": 3, "top_k": 2, "dispatch": "ring", "token_chunks": 2},
    {"ranks": 2, "top_k": 3, "dedup": True, "balance": "dynamic", "redundant_slots": 1},
    {"ranks": 1, "top_k": 1},
])
def test_the_layer_through_python_has_epmoe_layers_bits(tmp_path, keys):
    directory, arrays = inputs(tmp_path)
    out = tmp_path / "out"
    subprocess.run([tool(), "layer", "--in", str(directory), "--out", str(out),
                    *[f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in keys.items()]],
                   check=True, capture_output=True)
    got = epmoe.WholeWorldLayer(**keys).forward_backward(*(arrays[n] for n in ARRAYS), arrays["dy"])
    for name in OUTPUTS:
        expected = np.load(out / f"{name}.npy")
        assert got[name].dtype == expected.dtype and got[name].shape == expected.shape, name
        assert got[name].tobytes() == expected.tobytes(), f"{name} differs from epmoe layer's"


def test_forward_alone_gives_the_forward_of_forward_backward(tmp_path):
    _, arrays = inputs(tmp_path)
    layer = epmoe.WholeWorldLayer(ranks=2, top_k=2)
    y, ids, weights = layer.forward(*(arrays[n] for n in ARRAYS))
    both = layer.forward_backward(*(arrays[n] for n in ARRAYS), arrays["dy"])
    assert isinstance(y, np.ndarray) and ids.dtype == np.int32
    assert y.tobytes() == both["y"].tobytes() and ids.tobytes() == both["topk_ids"].tobytes()
    assert layer.metrics["expert_parallel"]["ranks"] == 2


def test_bad_arguments_raise_naming_the_argument(tmp_path):
    _, arrays = inputs(tmp_path)
    a = [arrays[n] for n in ARRAYS]
    with pytest.raises(ValueError, match="top_k"):
        epmoe.WholeWorldLayer(top_k=0)
    with pytest.raises(ValueError, match="rankz"):
        epmoe.WholeWorldLayer(rankz=2)
    with pytest.raises(TypeError, match="ranks"):
        epmoe.WholeWorldLayer(ranks=[2])
    layer = epmoe.WholeWorldLayer(ranks=2, top_k=2)
    with pytest.raises(TypeError, match="x has dtype float64"):
        layer.forward(a[0].astype(np.float64), *a[1:])
    with pytest.raises(TypeError, match="wi0 is not C-contiguous"):
        layer.forward(a[0], a[1], np.asfortranarray(a[2]), *a[3:])
    with pytest.raises(ValueError, match="gate"):
        layer.forward(a[0], a[1][:-1], *a[2:])
    with pytest.raises(ValueError, match="ranks=4: must divide num_experts=6"):
        epmoe.WholeWorldLayer(ranks=4, top_k=2).forward(*a)
    bad = a[0].copy()
    bad[3, 7] = np.nan
    with pytest.raises(ValueError, match=r"x\[3, 7\]"):
        layer.forward(bad, *a[1:])
    # The layer still works after refusing.
    layer.forward(*a)


def test_trace_file_is_written_by_each_call_or_refused_up_front(tmp_path):
    _, arrays = inputs(tmp_path)
    a = [arrays[n] for n in ARRAYS]
    trace = tmp_path / "trace.json"
    epmoe.WholeWorldLayer(ranks=2, top_k=2, trace_file=str(trace)).forward(*a)
    # Before, the key was accepted and nothing was written.
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["pid"] for e in events if e.get("ph") == "X"} == {0, 1}, "both ranks' timelines"
    (tmp_path / "d").mkdir()
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ValueError, match=r"trace_file=.*/d: is a directory"):
        epmoe.WholeWorldLayer(ranks=2, top_k=2, trace_file=str(tmp_path / "d"))
    assert sorted(os.listdir(tmp_path)) == before, "a refused trace_file left something behind"


def test_one_layers_fault_injection_never_fails_another_layer(tmp_path):
    # Before, the spec was process-wide: set by the faulty layer's first
    # call, its second hit was the clean layer's next call. forward() makes
    # one dispatch per call and rank.
    _, arrays = inputs(tmp_path)
    a = [arrays[n] for n in ARRAYS]
    clean = epmoe.WholeWorldLayer(ranks=2, top_k=2)
    want = clean.forward(*a)[0].tobytes()
    faulty = epmoe.WholeWorldLayer(ranks=2, top_k=2, fault_injection="1:dispatch:throw:2")
    for call in (1, 2, 3):
        if call == 2:
            with pytest.raises(RuntimeError, match=r"rank 1: injected fault at dispatch"):
                faulty.forward(*a)
        else:
            faulty.forward(*a)
        assert clean.forward(*a)[0].tobytes() == want, f"the clean layer after the faulty one's call {call}"


def test_the_gil_is_released_while_the_ranks_compute(tmp_path):
    _, arrays = inputs(tmp_path, num_tokens=512, hidden=64, ffn=64, num_experts=4)
    layer = epmoe.WholeWorldLayer(ranks=2, top_k=2)
    call = [arrays[n] for n in ARRAYS] + [arrays["dy"]]
    assert_releases_the_gil(lambda: layer.forward_backward(*call), 20, "the layer")


torch = pytest.importorskip("torch", reason="torch is not installed: the torch cases need it")


def test_torch_in_gives_torch_out(tmp_path):
    _, arrays = inputs(tmp_path)
    tensors = [torch.from_numpy(arrays[n]) for n in ARRAYS]
    y, ids, weights = epmoe.WholeWorldLayer(ranks=2, top_k=2).forward(*tensors)
    assert isinstance(y, torch.Tensor) and ids.dtype == torch.int32 and weights.dtype == torch.float32
    y_np, _, _ = epmoe.WholeWorldLayer(ranks=2, top_k=2).forward(*(arrays[n] for n in ARRAYS))
    assert y.numpy().tobytes() == y_np.tobytes()
    with pytest.raises(TypeError, match="gate is a ndarray but x is a torch tensor"):
        epmoe.WholeWorldLayer(ranks=2, top_k=2).forward(tensors[0], arrays["gate"], *tensors[2:])
