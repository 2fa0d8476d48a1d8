#!/usr/bin/env python3
"""The same single-rank MoE layer as bench_moe_layer, in PyTorch on the CPU.

Given its best settings (DESIGN.md §7): torch.set_num_threads to the same
thread count, one nn.Parameter per expert (no indexing of a stacked tensor),
tokens sorted by expert once so each expert runs dense matmuls on a
contiguous slice, index_add_ for the combine. Prints one JSON line in the
format of `bench_moe_layer json=true`.

    torch_moe_layer.py [tokens=2048 hidden=1024 ffn=512 experts=16 top_k=2
                        compute_dtype=f32|bf16 threads=N seconds=0.3]
"""
import json
import os
import sys
import time

import torch


def parse(argv):
    args = dict(tokens=2048, hidden=1024, ffn=512, experts=16, top_k=2,
                compute_dtype="f32", threads=os.cpu_count(), seconds=0.3)
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in args:
            sys.exit(f"torch_moe_layer.py: bad argument '{arg}' (keys: {', '.join(args)})")
        args[key] = type(args[key])(value) if key != "compute_dtype" else value
    return args


class MoeLayer(torch.nn.Module):
    def __init__(self, hidden, ffn, experts, top_k, dtype):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.top_k = top_k
        self.gate = torch.nn.Parameter(torch.randn(hidden, experts, generator=g) / hidden ** 0.5)
        scale_in, scale_out = hidden ** -0.5, ffn ** -0.5
        self.wi0 = torch.nn.ParameterList(
            [torch.nn.Parameter((torch.randn(hidden, ffn, generator=g) * scale_in).to(dtype)) for _ in range(experts)])
        self.wi1 = torch.nn.ParameterList(
            [torch.nn.Parameter((torch.randn(hidden, ffn, generator=g) * scale_in).to(dtype)) for _ in range(experts)])
        self.wo = torch.nn.ParameterList(
            [torch.nn.Parameter((torch.randn(ffn, hidden, generator=g) * scale_out).to(dtype)) for _ in range(experts)])
        self.dtype = dtype

    def forward(self, x):
        logits = x @ self.gate                      # router in fp32, as epmoe
        top_logits, top_ids = logits.topk(self.top_k, dim=1)
        weights = torch.softmax(top_logits, dim=1)  # softmax over the K
        flat_ids = top_ids.reshape(-1)
        order = torch.argsort(flat_ids, stable=True)
        counts = torch.bincount(flat_ids, minlength=len(self.wi0)).tolist()
        token_of_row = order // self.top_k
        x_sorted = x[token_of_row].to(self.dtype)
        outputs, start = [], 0
        for e, count in enumerate(counts):
            rows = x_sorted[start:start + count]
            act = torch.nn.functional.silu(rows @ self.wi0[e]) * (rows @ self.wi1[e])
            outputs.append(act @ self.wo[e])
            start += count
        expert_out = torch.cat(outputs).float() * weights.reshape(-1)[order].unsqueeze(1)
        y = torch.zeros_like(x)
        y.index_add_(0, token_of_row, expert_out)
        return y


def main():
    args = parse(sys.argv[1:])
    torch.set_num_threads(args["threads"])
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args["compute_dtype"]]
    layer = MoeLayer(args["hidden"], args["ffn"], args["experts"], args["top_k"], dtype)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(args["tokens"], args["hidden"], generator=g, requires_grad=True)
    dy = torch.randn(args["tokens"], args["hidden"], generator=g)

    def step():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        layer(x).backward(dy)

    step()  # warm-up
    probe = time.perf_counter()
    step()
    calls = max(1, int(args["seconds"] / max(time.perf_counter() - probe, 1e-9)))
    per_call = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            step()
        per_call.append((time.perf_counter() - start) / calls)
    per_call.sort()
    median = per_call[2]
    rows = args["tokens"] * args["top_k"]
    flops = 18.0 * rows * args["hidden"] * args["ffn"] + 6.0 * args["tokens"] * args["hidden"] * args["experts"]
    print(json.dumps({
        "impl": f"pytorch {torch.__version__}", "compute_dtype": args["compute_dtype"],
        "tokens": args["tokens"], "hidden": args["hidden"], "ffn": args["ffn"],
        "experts": args["experts"], "top_k": args["top_k"], "threads": torch.get_num_threads(),
        "fwd_bwd_seconds": median, "spread": (per_call[-1] - per_call[0]) / median,
        "gflops": flops / median * 1e-9}))


if __name__ == "__main__":
    main()
