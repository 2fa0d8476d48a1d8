"""The Python layer call's overhead over the C++ call: epmoe.WholeWorldLayer.forward
against ExpertParallelLayer::run (bench/api_layer_call.cc) on the same
arrays and keys, median wall time of many calls each, small shapes (where a
fixed overhead shows most) and a larger one.

    python bench/peers/python_layer_overhead.py [BUILD_DIR]    (default build; needs `pip install .`)
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import epmoe

build = sys.argv[1] if len(sys.argv) > 1 else "build"
shapes = [  # (gen-inputs keys, repeats)
    ({"num_tokens": 64, "hidden": 32, "ffn": 48, "num_experts": 8}, 400),
    ({"num_tokens": 1024, "hidden": 256, "ffn": 512, "num_experts": 8}, 40),
]
layer_keys = {"ranks": 2, "top_k": 2}
print(f"{'shape':<34} {'C++ run() us':>13} {'Python us':>10} {'overhead us':>12} {'ratio':>6}")
for dims, repeats in shapes:
    with tempfile.TemporaryDirectory() as directory:
        subprocess.run([os.path.join(build, "epmoe"), "gen-inputs", "--out", directory, "with_dy=false",
                        *[f"{k}={v}" for k, v in dims.items()]], check=True, capture_output=True)
        cpp = float(subprocess.run([os.path.join(build, "bench", "bench_api_layer_call"), directory, str(repeats),
                                    *[f"{k}={v}" for k, v in layer_keys.items()]],
                                   check=True, capture_output=True, text=True).stdout)
        arrays = [np.load(os.path.join(directory, f"{name}.npy")) for name in ("x", "gate", "wi0", "wi1", "wo")]
    layer = epmoe.WholeWorldLayer(**layer_keys)
    layer.forward(*arrays)  # warm-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        layer.forward(*arrays)
        seconds.append(time.perf_counter() - start)
    python = statistics.median(seconds) * 1e6
    name = "N={num_tokens} H={hidden} F={ffn} E={num_experts}".format(**dims)
    print(f"{name:<34} {cpp:>13.1f} {python:>10.1f} {python - cpp:>12.1f} {python / cpp:>6.3f}")
