"""epmoe.torch.MoeLayer's forward+backward against the per-rank C++ layer's
at the same shape, one rank (a single-rank EP group), in one process.

The baseline is the C++ MoeLayer driven through the native module
(_epmoe.MoeLayer: begin_forward, finish_forward, begin_backward,
finish_backward) into output and gradient arrays allocated once: the C++
calls plus the binding's argument conversion (a few microseconds a step,
printed below as the tiny shape's whole step). That is the fair comparison
because both sides then run in the same process on the same arrays, the
same compute threads and the same allocator state, so the ratio is exactly
what the module adds: autograd's bookkeeping, the numpy views of the
tensors, new outputs and gradients every step (epmoe's buffers from its
cache, wrapped as tensors) handed to the parameters' .grad. The old
epmoe.torch.moe recomputed a whole forward inside its backward (a ratio of
about 1.5 at best).

Repetitions alternate baseline and module so that a change in the
machine's load hits both: per shape, the medians of each and their ratio,
and the median of the per-repetition ratios (each from one pair of
neighbouring steps, the estimate least moved by the load of a shared
machine).

    python bench/peers/torch_module_vs_layer.py [repeats=20] [threads=1]
"""

import statistics
import sys
import time

import numpy as np
import torch

import epmoe
import epmoe.torch
from epmoe import _epmoe

settings = {"repeats": 20, "threads": 1}
for argument in sys.argv[1:]:
    key, _, value = argument.partition("=")
    if key not in settings:
        sys.exit(f"torch_module_vs_layer.py: bad argument '{argument}' (keys: {', '.join(settings)})")
    settings[key] = int(value)
torch.set_num_threads(settings["threads"])
epmoe.set_compute_threads(settings["threads"])

SHAPES = [  # tokens, hidden, ffn, experts, top_k
    (64, 32, 48, 8, 2),
    (256, 128, 256, 8, 2),
    (1024, 256, 512, 8, 2),
]

print(f"{settings['threads']} compute threads; medians of {settings['repeats']} forward+backward steps each")
print(f"{'shape':<32} {'C++ layer ms':>13} {'torch module ms':>16} {'ratio':>6} {'paired':>7}")
for n, h, f, e, k in SHAPES:
    group = epmoe.EpGroup(None, num_experts=e, top_k=k, hidden=h)
    module = epmoe.torch.MoeLayer(group, ffn=f, seed=1)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((n, h), dtype=np.float32)).requires_grad_()
    dy = torch.from_numpy(rng.standard_normal((n, h), dtype=np.float32))

    # The baseline: the same weights' memory, read in place, outputs into arrays allocated once.
    layer = epmoe.MoeLayer(group, ffn=f)._layer
    x_np, dy_np = x.detach().numpy(), dy.numpy()
    weights = [p.detach().numpy() for p in (module.gate, module.wi0, module.wi1, module.wo)]
    outputs = (np.empty((n, h), np.float32), np.empty((n, k), np.int32), np.empty((n, k), np.float32))
    gradients = (np.empty((n, h), np.float32), np.empty((h, e), np.float32), np.empty(weights[2].shape, np.float32),
                 np.empty(weights[2].shape, np.float32), np.empty(weights[3].shape, np.float32))

    def layer_step():
        step = layer.begin_forward(x_np, *weights, None, None)
        layer.finish_forward(step, *outputs)
        layer.begin_backward(step, dy_np, None)
        layer.finish_backward(step, *gradients)

    def module_step():
        for p in (x, *module.parameters()):
            p.grad = None  # set_to_none, as optimizer.zero_grad(set_to_none=True)
        module(x).backward(dy)

    for _ in range(3):  # warm-up: oneDNN's primitives, the buffer cache, the allocator
        layer_step()
        module_step()
    layer_seconds, module_seconds = [], []
    for _ in range(settings["repeats"]):
        for step, seconds in ((layer_step, layer_seconds), (module_step, module_seconds)):
            start = time.perf_counter()
            step()
            seconds.append(time.perf_counter() - start)
    # The module computed what the layer did: the same bits.
    assert module.wo.grad.numpy().tobytes() == gradients[4].tobytes()
    cpp, mod = statistics.median(layer_seconds) * 1e3, statistics.median(module_seconds) * 1e3
    paired = statistics.median(m / c for m, c in zip(module_seconds, layer_seconds))
    print(f"{f'N={n} H={h} F={f} E={e} K={k}':<32} {cpp:>13.3f} {mod:>16.3f} {mod / cpp:>6.3f} {paired:>7.3f}")
