#!/usr/bin/env python3
"""epmoe.rebalance_experts vs EPLB's rebalance_experts, two Python versions, in one run.

    python bench/peers/eplb_vs_vllm.py [--wheel-dir DIR] [--layers 1,58] [--seeds 100]
                                       [--peers vllm==0.10.0,vllm]

Each peer is a vLLM wheel fetched from PyPI at run time (`pip download
<spec> --no-deps`, into a folder per spec under --wheel-dir, a temporary one
unless given); only its EPLB policy module is extracted (under
vllm/distributed/eplb/: the file that defines balanced_packing and
rebalance_experts, and the sibling files it imports) and loaded alone: no
vLLM code is kept in this repository. The default peers:
  * vllm==0.10.0: vllm/distributed/eplb/rebalance_algo.py, DeepSeek's EPLB
    (github.com/deepseek-ai/EPLB, eplb.py) as published: torch tensors and
    Python loops, the code SGLang and Megatron-Core also carry;
  * vllm (the newest): vLLM's rewrite of the same algorithm on numpy arrays
    (vllm/distributed/eplb/policy/default.py in 0.33), the fastest Python
    EPLB we know of.
Both modules import torch, so torch must be importable (the script says so
and stops when it is not).

Prints, for E=256 experts on 64 GPUs (8 nodes x 8, 320 replicas, 8 groups:
the hierarchical policy) and E=64 on 8 GPUs (one node, 72 replicas, 8 groups),
the CPU time per call of each (median over repeated calls after a warm-up,
the calling thread's CPU time; the inputs are the same Zipf loads), the
ratios, and each placement's max/mean GPU load (a copy carries its expert's
load / copies). Then the balance check of docs/BALANCE.md against the newest
peer: over random, Zipf and adversarial loads, how often epmoe's placement
has a lower, equal or higher max/mean than EPLB's, and how often EPLB's
placement puts two copies of one expert on one GPU.
"""

import argparse
import glob
import importlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile

import numpy as np

import epmoe


def fetch_eplb_module(wheel_root, spec):
    wheel_dir = os.path.join(wheel_root, spec.replace("=", "_") if "=" in spec else "newest")
    os.makedirs(wheel_dir, exist_ok=True)
    wheels = sorted(glob.glob(os.path.join(wheel_dir, "vllm-*.whl")))
    if not wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", spec, "--no-deps", "-q", "-d", wheel_dir], check=True
        )
        wheels = sorted(glob.glob(os.path.join(wheel_dir, "vllm-*.whl")))
    wheel = wheels[-1]
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.startswith("vllm/distributed/eplb/") and n.endswith(".py")]
        module_name = None
        for name in names:
            text = archive.read(name).decode()
            if "def balanced_packing" in text and "def rebalance_experts" in text:
                module_name = name
                break
        if module_name is None:
            raise SystemExit(f"{wheel}: no module under vllm/distributed/eplb/ defines balanced_packing")
        # The module's folder as a package of its own (its __init__ imports vLLM; an empty one does not).
        folder = os.path.dirname(module_name)
        package = "_eplb_" + "".join(c if c.isalnum() else "_" for c in os.path.basename(wheel_dir))
        package_dir = os.path.join(wheel_dir, package)
        os.makedirs(package_dir, exist_ok=True)
        for name in names:
            if os.path.dirname(name) == folder and not name.endswith("__init__.py"):
                with open(os.path.join(package_dir, os.path.basename(name)), "wb") as out:
                    out.write(archive.read(name))
        open(os.path.join(package_dir, "__init__.py"), "w").close()
    sys.path.insert(0, wheel_dir)
    module = importlib.import_module(package + "." + os.path.basename(module_name)[:-3])
    function = getattr(module, "rebalance_experts", None)
    if function is None:  # vLLM >= 0.11: a policy class
        policy = next(v for v in vars(module).values() if isinstance(v, type) and hasattr(v, "balanced_packing"))
        function = policy.rebalance_experts
    return os.path.basename(wheel), module_name, function


def eplb_phy2log(eplb, weight, shape):
    out = eplb(weight, *shape)
    out = out[0] if isinstance(out, tuple) else out
    return np.asarray(out.cpu().numpy() if hasattr(out, "cpu") else out, dtype=np.int64)


def max_over_mean(weight, phy2log, num_gpus):
    """Per layer: max/mean GPU load, each copy carrying its expert's load / copies."""
    weight = np.asarray(weight, dtype=np.float64)
    layers, experts = weight.shape
    ratios = []
    for layer in range(layers):
        counts = np.bincount(phy2log[layer], minlength=experts)
        loads = (weight[layer] / counts)[phy2log[layer]].reshape(num_gpus, -1).sum(axis=1)
        ratios.append(loads.max() / loads.mean() if loads.mean() > 0 else 1.0)
    return np.array(ratios)


def duplicates(phy2log, num_gpus):
    """(layer, GPU) pairs holding some expert twice."""
    per_gpu = phy2log.reshape(phy2log.shape[0], num_gpus, -1)
    return sum(len(set(row.tolist())) < len(row) for layer in per_gpu for row in layer)


def make_weight(kind, layers, experts, rng):
    if kind == "random":
        return rng.integers(0, 1000, size=(layers, experts)).astype(np.float32)
    ranks = np.stack([rng.permutation(experts) for _ in range(layers)])
    if kind == "zipf":
        s = rng.uniform(0.6, 1.6)
        return np.floor(100000.0 / (1.0 + ranks) ** s).astype(np.float32)
    hot = int(rng.integers(1, 4))  # adversarial: 1-3 experts carry nearly everything
    return np.where(ranks < hot, 100000.0, rng.integers(0, 3, size=ranks.shape)).astype(np.float32)


def time_call(call, repeats):
    """Median CPU time of the calling thread per call, in µs (both run in it: EPLB's numpy/torch with one
    thread, epmoe's C++ with the GIL released). CPU time, not wall time: on a machine shared with other
    work, wall time measures the scheduler as much as the code."""
    call()  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.thread_time_ns()
        call()
        samples.append(time.thread_time_ns() - start)
    return float(np.median(samples)) / 1000.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel-dir", help="folder holding (or to receive) the vLLM wheels; default: a temporary one")
    parser.add_argument("--layers", default="1,58", help="layers per call, comma separated (58: DeepSeek-V3)")
    parser.add_argument("--seeds", type=int, default=100, help="loads per kind and shape for the balance check")
    parser.add_argument(
        "--peers", default="vllm==0.10.0,vllm", help="pip specs of the vLLM wheels whose EPLB module to time"
    )
    args = parser.parse_args()
    try:
        import torch
    except Exception as error:
        raise SystemExit(f"torch is not importable ({error}): vLLM's EPLB module needs it; pip install torch")
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as temporary:
        wheel_root = args.wheel_dir or temporary
        peers = []
        for spec in args.peers.split(","):
            wheel, module_name, function = fetch_eplb_module(wheel_root, spec)
            peers.append((wheel.split("-")[1], function))
            print(f"EPLB peer {len(peers)}: {module_name} from {wheel}")
        print(f"epmoe {epmoe.__version__}; torch {torch.__version__}; numpy {np.__version__}")
        eplb = peers[-1][1]  # the balance check is against the newest
        shapes = {"E=256, 64 GPUs": (320, 8, 8, 64), "E=64, 8 GPUs": (72, 8, 1, 8)}
        experts_of = {"E=256, 64 GPUs": 256, "E=64, 8 GPUs": 64}

        peer_columns = "".join(f" vLLM {version} CPU µs | ratio |" for version, _ in peers)
        print(f"\n| shape | layers | epmoe CPU µs |{peer_columns} EPLB max/mean | epmoe max/mean |")
        print("|---|---:|---:|" + "---:|---:|" * len(peers) + "---:|---:|")
        rng = np.random.default_rng(0)
        for label, shape in shapes.items():
            for layers in (int(x) for x in args.layers.split(",")):
                weight = np.floor(
                    100000.0 / (1.0 + np.stack([rng.permutation(experts_of[label]) for _ in range(layers)])) ** 1.2
                ).astype(np.float32)
                weight_torch = torch.from_numpy(weight)
                ours_us = time_call(lambda: epmoe.rebalance_experts(weight_torch, *shape), 200)
                cells = ""
                for _, function in peers:
                    peer_us = time_call(lambda: function(weight_torch, *shape), 5 if layers > 1 else 20)
                    cells += f" {peer_us:.0f} | {peer_us / ours_us:.0f}x |"
                theirs = max_over_mean(weight, eplb_phy2log(eplb, weight_torch, shape), shape[3]).mean()
                ours = max_over_mean(weight, epmoe.rebalance_experts(weight, *shape)[0], shape[3]).mean()
                print(f"| {label} | {layers} | {ours_us:.1f} |{cells} {theirs:.4f} | {ours:.4f} |")

        print(f"\nBalance check: {args.seeds} loads per kind and shape, one layer each; max/mean epmoe vs EPLB")
        print("| shape | loads | lower | equal (1e-9) | higher | worst (epmoe - EPLB) | EPLB layers with a duplicate |")
        print("|---|---|---:|---:|---:|---:|---:|")
        check_shapes = dict(shapes)
        check_shapes["E=64, 8 GPUs, global"] = (72, 8, 3, 6)  # 8 % 3: the global policy (6 GPUs, 12 slots)
        experts_of["E=64, 8 GPUs, global"] = 64
        for label, shape in check_shapes.items():
            for kind in ("random", "zipf", "adversarial"):
                rng = np.random.default_rng(1)
                lower = equal = higher = dup_layers = 0
                worst = -np.inf
                for _ in range(args.seeds):
                    weight = make_weight(kind, 1, experts_of[label], rng)
                    theirs_map = eplb_phy2log(eplb, torch.from_numpy(weight), shape)
                    theirs = max_over_mean(weight, theirs_map, shape[3])[0]
                    ours = max_over_mean(weight, epmoe.rebalance_experts(weight, *shape)[0], shape[3])[0]
                    dup_layers += duplicates(theirs_map, shape[3]) > 0
                    worst = max(worst, ours - theirs)
                    if ours < theirs - 1e-9:
                        lower += 1
                    elif ours > theirs + 1e-9:
                        higher += 1
                    else:
                        equal += 1
                print(f"| {label} | {kind} | {lower} | {equal} | {higher} | {worst:+.4f} | {dup_layers} |")


if __name__ == "__main__":
    main()
