#!/usr/bin/env python3
"""The replay table of docs/BENCHMARKS.md ("Balance quality"): none / eplb /
dynamic / hybrid over generated Zipf loads, printed as Markdown.

    python3 scripts/balance_replay_table.py BUILD_DIR [--quick]

Scenarios: Zipf s in {1.0, 1.2, 1.5}; hot experts spread or packed; drift none,
a random adjacent swap every step, or a rotation by one rank every 25 steps;
E=64 R=8 and E=256 R=64 (1024 tokens per rank, top-8, 200 steps, seed 0);
B in {1, 2}; rebalance_threshold=1.0, window=period=50. Each cell: mean
max/mean over all 200 steps / over the steady state (steps 50-199, once eplb
and hybrid have a window). The last columns check the goal of issue 13:
dynamic at B=2 <= 1.02 and never worse than eplb's steady state.
--quick: one drift and one size, for a smoke run.
"""
import json
import os
import subprocess
import sys
import tempfile

POLICIES = ["none", "eplb", "dynamic", "hybrid"]


def run(binary, *args):
    done = subprocess.run([binary, *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join([binary, *args])} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    binary = os.path.join(sys.argv[1], "epmoe")
    quick = "--quick" in sys.argv[2:]
    sizes = [(64, 8)] if quick else [(64, 8), (256, 64)]
    drifts = [("none", 1)] if quick else [("none", 1), ("swap", 1), ("rotate", 25)]
    print("| E | R | hot | s | drift | B | none | eplb | dynamic | hybrid | dynamic at ideal | goal |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    misses = 0
    with tempfile.TemporaryDirectory() as scratch:
        for experts, ranks in sizes:
            for placement in ["spread", "packed"]:
                for zipf in ["1.0", "1.2", "1.5"]:
                    for drift, interval in drifts:
                        loads = os.path.join(scratch, "loads.npy")
                        run(binary, "balance", "--generate", loads, f"experts={experts}", f"ranks={ranks}",
                            "tokens_per_rank=1024", "top_k=8", "steps=200", f"zipf={zipf}",
                            f"placement={placement}", f"drift={drift}", f"drift_interval={interval}", "seed=0")
                        for slots in [1, 2]:
                            report = json.loads(run(binary, "balance", "--loads", loads, f"ranks={ranks}",
                                                    f"slots={slots}", "window=50", "period=50",
                                                    "rebalance_threshold=1.0", "plans=false", "--json"))
                            rows = {row["policy"]: row for row in report["policies"]}
                            cells = [f"{rows[p]['mean_max_over_mean']:.3f} / "
                                     f"{rows[p]['mean_max_over_mean_from_first_period']:.3f}" for p in POLICIES]
                            dynamic = rows["dynamic"]["mean_max_over_mean"]
                            eplb_steady = rows["eplb"]["mean_max_over_mean_from_first_period"]
                            goal = ""
                            if slots == 2:
                                ok = dynamic <= 1.02 and dynamic <= eplb_steady
                                misses += not ok
                                goal = "met" if ok else f"**missed** (eplb {eplb_steady:.3f})"
                            at_ideal = 100 * rows["dynamic"]["fraction_of_steps_at_ideal"]
                            drift_text = "none" if drift == "none" else f"{drift}/{interval}"
                            print(f"| {experts} | {ranks} | {placement} | {zipf} | {drift_text} | {slots} | "
                                  + " | ".join(cells) + f" | {at_ideal:.0f}% | {goal} |", flush=True)
    print(f"\nB=2 scenarios missing the goal: {misses}")


if __name__ == "__main__":
    main()
