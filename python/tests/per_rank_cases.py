"""The per-rank API against `epmoe layer`: the cases, each rank's share of
the arrays, one rank's run, and the ranks' outputs assembled into the
shapes `epmoe layer` writes. Shared by the threads tests (test_per_rank_layer.py)
and the ranks under mpirun (mpi_ranks.py).

Topology: N = 40 tokens, H = 24, F = 20, E = 12 experts, K = 2 (3 with
replicas); rank r of R holds token rows [r*N//R, (r+1)*N//R) (R = 3 gives
13, 13, 14 rows) and experts [r*E/R, (r+1)*E/R), as `epmoe layer ranks=R`
gives them. The assembled outputs: y, topk_ids, topk_weights and dx
concatenated in rank order, dwi0/dwi1/dwo concatenated in rank order, and
dgate summed in rank order (((d0 + d1) + d2) + d3 in float32, as epmoe layer
sums it).
"""

import os
import subprocess

import numpy as np

DIMS = {"num_tokens": 40, "hidden": 24, "ffn": 20, "num_experts": 12, "seed": 5}
ARRAYS = ("x", "gate", "wi0", "wi1", "wo")
OUTPUTS = ("y", "topk_ids", "topk_weights", "dx", "dgate", "dwi0", "dwi1", "dwo")

# Keys of `epmoe layer`; top_k is the group's argument, the rest group keys.
CASES = {
    "alltoall": {"top_k": 2},
    "alltoall_dedup": {"top_k": 2, "dedup": True},
    "chunks": {"top_k": 2, "token_chunks": 3},
    "fp8_tokens": {"top_k": 2, "fp8_tokens": "token", "dedup": True},
    "ring": {"top_k": 2, "dispatch": "ring", "token_chunks": 2},
    "ring_bf16_wire": {"top_k": 2, "dispatch": "ring", "wire_dtype": "bf16"},
    "replicas": {"top_k": 3, "dedup": True, "balance": "dynamic", "redundant_slots": 1},
}


def key_value(value):
    return str(value).lower() if isinstance(value, bool) else str(value)


def epmoe_tool(repo):
    tool = os.environ.get("EPMOE_BINARY", os.path.join(repo, "build", "epmoe"))
    if not os.access(tool, os.X_OK):
        raise FileNotFoundError(f"the epmoe tool is not built at {tool} (set EPMOE_BINARY or build the project)")
    return tool


def generate_inputs(tool, directory):
    subprocess.run([tool, "gen-inputs", "--out", str(directory), *[f"{k}={v}" for k, v in DIMS.items()]],
                   check=True, capture_output=True)
    return {name: np.load(os.path.join(directory, f"{name}.npy")) for name in (*ARRAYS, "dy")}


def run_tool(tool, in_directory, out_directory, keys, ranks):
    subprocess.run([tool, "layer", "--in", str(in_directory), "--out", str(out_directory), f"ranks={ranks}",
                    *[f"{k}={key_value(v)}" for k, v in keys.items()]], check=True, capture_output=True)
    return {name: np.load(os.path.join(out_directory, f"{name}.npy")) for name in OUTPUTS}


def rank_share(arrays, rank, num_ranks):
    """Rank r's rows of x and dy and its experts' weights (views, no copies)."""
    n, e = arrays["x"].shape[0], arrays["gate"].shape[1]
    first, last = n * rank // num_ranks, n * (rank + 1) // num_ranks
    local = e // num_ranks
    experts = slice(rank * local, (rank + 1) * local)
    return {"x": arrays["x"][first:last], "dy": arrays["dy"][first:last], "gate": arrays["gate"],
            "wi0": arrays["wi0"][experts], "wi1": arrays["wi1"][experts], "wo": arrays["wo"][experts]}


def single_rank_local(keys, num_ranks):
    """Whether `epmoe layer ranks=1` runs these keys on a single-rank group
    without a communicator (cli/expert_parallel_settings.cc): one rank and
    nothing that needs a transport. A group over a communicator of one rank
    combines in another order (y differs in the last bit), so the per-rank
    run mirrors the tool's choice."""
    return num_ranks == 1 and keys.get("dispatch", "alltoall") == "alltoall" and not keys.get("dedup") and \
        keys.get("fp8_tokens", "off") == "off" and keys.get("balance", "off") == "off" and \
        keys.get("wire_dtype", "auto") in ("auto", "f32")


def run_rank(epmoe, communicator, arrays, keys, num_ranks, rank):
    """One rank's forward and backward through epmoe.EpGroup and epmoe.MoeLayer: its outputs by name."""
    if single_rank_local(keys, num_ranks):
        communicator = None
    share = rank_share(arrays, rank, num_ranks)
    group_keys = {k: v for k, v in keys.items() if k != "top_k"}
    group = epmoe.EpGroup(communicator, num_experts=arrays["gate"].shape[1], top_k=keys["top_k"],
                          hidden=arrays["x"].shape[1], **group_keys)
    layer = epmoe.MoeLayer(group, ffn=arrays["wi0"].shape[2])
    out = layer.forward(share["x"], share["gate"], share["wi0"], share["wi1"], share["wo"])
    grads = layer.backward(share["dy"])
    return {**out._asdict(), **grads._asdict()}


def assemble(parts):
    """The ranks' outputs (rank order) in the shapes `epmoe layer` writes."""
    full = {name: np.concatenate([p[name] for p in parts]) for name in OUTPUTS if name != "dgate"}
    dgate = parts[0]["dgate"].copy()
    for p in parts[1:]:
        dgate += p["dgate"]
    full["dgate"] = dgate
    return full


def differences(got, want):
    """The outputs whose bytes, dtype or shape differ."""
    return [name for name in OUTPUTS
            if got[name].dtype != want[name].dtype or got[name].shape != want[name].shape
            or got[name].tobytes() != want[name].tobytes()]
