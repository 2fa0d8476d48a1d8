#!/usr/bin/env python3
"""epmoe.rebalance_experts vs EPLB's rebalance_experts as vLLM ships it, in one run.

    python bench/peers/eplb_vs_vllm.py [--wheel-dir DIR] [--layers 1,58] [--seeds 200]

Fetches vLLM's wheel from PyPI at run time (`pip download vllm --no-deps`,
into a temporary folder unless --wheel-dir names one that already holds it),
extracts only its EPLB policy module (vllm/distributed/eplb/: the file that
defines balanced_packing and rebalance_experts, and the sibling files it
imports), and loads that alone: no vLLM code is kept in this repository. The
module imports torch, so torch must be importable (the script says so and
stops when it is not).

Prints, for E=256 experts on 64 GPUs (8 nodes x 8, 320 replicas, 8 groups:
the hierarchical policy) and E=64 on 8 GPUs (one node, 72 replicas, 8 groups),
the CPU time per call of each (median over repeated calls after a warm-up,
the calling thread's CPU time; the inputs are the same Zipf loads), the ratio, and each placement's max/mean GPU
load (a copy carries its expert's load / copies). Then the balance check of
docs/BALANCE.md: over random, Zipf and adversarial loads, how often epmoe's
placement has a lower, equal or higher max/mean than EPLB's, and how often
EPLB's placement puts two copies of one expert on one GPU.
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


def fetch_eplb_module(wheel_dir):
    wheels = sorted(glob.glob(os.path.join(wheel_dir, "vllm-*.whl")))
    if not wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "vllm", "--no-deps", "-q", "-d", wheel_dir], check=True
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
        package_dir = os.path.join(wheel_dir, "_vllm_eplb")
        os.makedirs(package_dir, exist_ok=True)
        for name in names:
            if os.path.dirname(name) == folder and not name.endswith("__init__.py"):
                with open(os.path.join(package_dir, os.path.basename(name)), "wb") as out:
                    out.write(archive.read(name))
        open(os.path.join(package_dir, "__init__.py"), "w").close()
    sys.path.insert(0, wheel_dir)
    module = importlib.import_module("_vllm_eplb." + os.path.basename(module_name)[:-3])
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
    parser.add_argument("--wheel-dir", help="folder holding (or to receive) vLLM's wheel; default: a temporary one")
    parser.add_argument("--layers", default="1,58", help="layers per call, comma separated (58: DeepSeek-V3)")
    parser.add_argument("--seeds", type=int, default=100, help="loads per kind and shape for the balance check")
    args = parser.parse_args()
    try:
        import torch
    except Exception as error:
        raise SystemExit(f"torch is not importable ({error}): vLLM's EPLB module needs it; pip install torch")
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as temporary:
        wheel_dir = args.wheel_dir or temporary
        wheel, module_name, eplb = fetch_eplb_module(wheel_dir)
        print(f"EPLB: {module_name} from {wheel}; epmoe {epmoe.__version__}; torch {torch.__version__}")
        shapes = {"E=256, 64 GPUs": (320, 8, 8, 64), "E=64, 8 GPUs": (72, 8, 1, 8)}
        experts_of = {"E=256, 64 GPUs": 256, "E=64, 8 GPUs": 64}

        print("\n| shape | layers | EPLB (vLLM) CPU µs | epmoe CPU µs | ratio | EPLB max/mean | epmoe max/mean |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        rng = np.random.default_rng(0)
        for label, shape in shapes.items():
            for layers in (int(x) for x in args.layers.split(",")):
                weight = np.floor(
                    100000.0 / (1.0 + np.stack([rng.permutation(experts_of[label]) for _ in range(layers)])) ** 1.2
                ).astype(np.float32)
                weight_torch = torch.from_numpy(weight)
                eplb_us = time_call(lambda: eplb(weight_torch, *shape), 5 if layers > 1 else 20)
                ours_us = time_call(lambda: epmoe.rebalance_experts(weight_torch, *shape), 200)
                theirs = max_over_mean(weight, eplb_phy2log(eplb, weight_torch, shape), shape[3]).mean()
                ours = max_over_mean(weight, epmoe.rebalance_experts(weight, *shape)[0], shape[3]).mean()
                print(
                    f"| {label} | {layers} | {eplb_us:.0f} | {ours_us:.1f} | {eplb_us / ours_us:.0f}x "
                    f"| {theirs:.4f} | {ours:.4f} |"
                )

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
