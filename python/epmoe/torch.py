"""epmoe.torch.moe: epmoe's expert-parallel MoE layer as a
torch.autograd.Function, so that a PyTorch model on the CPU gets y from epmoe
and every gradient (x, gate, wi0, wi1, wo) back from epmoe's backward.

    from epmoe.torch import moe
    y = moe(x, gate, wi0, wi1, wo, top_k=2, ranks=2)   # keys of `epmoe layer`
    y.sum().backward()                                  # x.grad, gate.grad, wi0.grad, ...

The backward recomputes the forward (one epmoe layer run with dy does both),
as remat_policy=full would: each call of MoeLayer is a whole expert-parallel
run, so no state is kept between the two. The routing (topk ids and weights)
is not differentiable through this function; its gradient reaches gate
through y, as in the layer itself.
"""

from __future__ import annotations

import torch

from .layer import MoeLayer

__all__ = ["moe", "MoeFunction"]


class MoeFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, layer: MoeLayer, x, gate, wi0, wi1, wo, bias):
        arrays = [a.detach().contiguous() if a.dtype == torch.float32 else a for a in (x, gate, wi0, wi1, wo)]
        y, _, _ = layer.forward(*arrays, bias=bias)
        ctx.layer = layer
        ctx.bias = bias
        ctx.save_for_backward(*arrays)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, gate, wi0, wi1, wo = ctx.saved_tensors
        grads = ctx.layer.forward_backward(x, gate, wi0, wi1, wo, dy.contiguous().to(torch.float32), bias=ctx.bias)
        return None, grads["dx"], grads["dgate"], grads["dwi0"], grads["dwi1"], grads["dwo"], None


def moe(x, gate, wi0, wi1, wo, bias=None, layer: MoeLayer | None = None, **keys):
    """y = epmoe's MoE layer of x [N, H] (float32 CPU tensors), differentiable
    in x, gate, wi0, wi1 and wo. Keys as MoeLayer's; or pass a `layer` to
    reuse one."""
    if layer is None:
        layer = MoeLayer(**keys)
    elif keys:
        raise TypeError(f"moe: pass either layer= or keys, not both (got {sorted(keys)})")
    return MoeFunction.apply(layer, x, gate, wi0, wi1, wo, bias)
