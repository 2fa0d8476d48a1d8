"""epmoe in a PyTorch model on the CPU, per rank (float32 tensors).

* ``MoeLayer(group, ffn, **keys)``: a torch.nn.Module, one rank's routed
  MoE layer on an epmoe.EpGroup. Its parameters are the replicated router
  gate [H, E] and this rank's experts, wi0 / wi1 [E_l, H, F] and wo
  [E_l, F, H] (E_l = E / R, experts [rank * E_l, (rank + 1) * E_l)). Its
  forward runs epmoe's forward and keeps the step (the dispatch layout, the
  expert rows and activations the remat policy saves) in the autograd
  graph; its backward runs epmoe's backward on that step: nothing is
  recomputed.
* ``dispatch(group, x, topk_ids, topk_weights)`` and ``combine(group,
  handle, expert_outputs, row_weights)``: epmoe's dispatch and combine as
  autograd functions, for a model with its own router and expert compute
  (DeepEP's dispatch / combine). dispatch's backward is epmoe's
  dispatch_backward (a combine of the rows' gradients), combine's is
  combine_backward (a dispatch of dy); both reuse the dispatch's handle.

    group = epmoe.EpGroup(MPI.COMM_WORLD, num_experts=8, top_k=2, hidden=64)
    moe = epmoe.torch.MoeLayer(group, ffn=128)
    y = moe(x)                         # x [..., H], this rank's tokens
    loss.backward()                    # moe.gate.grad is this rank's part: all-reduce it

Replaces epmoe.torch.moe / MoeFunction, which wrapped the whole-world layer
and recomputed the whole forward inside every backward.

Importing this module imports torch; ``import epmoe`` does not.
"""

from __future__ import annotations

from collections import namedtuple

import torch
from torch.autograd.function import once_differentiable

from .ep_group import EpGroup
from .moe_layer import MoeLayer as _RankLayer

__all__ = ["MoeLayer", "dispatch", "combine", "Dispatched"]


def _view(tensor):
    """The tensor's memory as a numpy array (no copy), without autograd's history."""
    return tensor.detach().numpy()


class _MoeFunction(torch.autograd.Function):
    """y, topk_ids, topk_weights = epmoe's forward; the backward uses the forward's step.

    The outputs and gradients are epmoe's own buffers (from its per-thread
    cache of blocks whose pages are already touched), wrapped as tensors
    without a copy: tensors from torch.empty every step cost a page fault
    per 4 KiB once glibc has returned the previous step's freed blocks to
    the system, 2.5 ms of a 10 ms step at N=256 H=128 F=256 E=8 here
    (docs/BENCHMARKS.md)."""

    @staticmethod
    def forward(ctx, layer: _RankLayer, x, gate, wi0, wi1, wo, bias):
        native = layer._layer
        # numpy views of the tensors' memory (no copy): the binding reads them
        # through the buffer protocol, ~16 us a step cheaper than DLPack here.
        step = native.begin_forward(_view(x), _view(gate), _view(wi0), _view(wi1), _view(wo),
                                    None if bias is None else _view(bias), None)
        y, topk_ids, topk_weights = (torch.from_numpy(a) for a in native.finish_forward(step))
        ctx.layer, ctx.step = native, step
        ctx.mark_non_differentiable(topk_ids, topk_weights)
        return y, topk_ids, topk_weights

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, _d_topk_ids, _d_topk_weights):
        native, step = ctx.layer, ctx.step
        del ctx.step  # the step's saved activations go with this backward
        native.begin_backward(step, _view(dy.contiguous()), None)
        dx, dgate, dwi0, dwi1, dwo = (torch.from_numpy(a) for a in native.finish_backward(step))
        return None, dx, dgate, dwi0, dwi1, dwo, None


def _expert_seed(seed: int, expert: int) -> int:
    # Expert e's generator depends on (seed, e) alone, so a model split over
    # any number of ranks starts from the same weights.
    return (seed * 1_000_003 + 7919 * (expert + 1)) % (2**63)


class MoeLayer(torch.nn.Module):
    """One rank's routed MoE layer, y = sum_k w_k expert_{id_k}(x), SwiGLU
    experts (expert_e(x) = (silu(x wi0_e) * (x wi1_e)) wo_e).

    group: the rank's epmoe.EpGroup (E, K and H are its); ffn: F; keys: the
    layer's keys of `epmoe layer` (router, norm_topk_prob, n_groups,
    topk_groups, routed_scaling_factor, compute_dtype="bf16" for bf16 GEMM
    operands with fp32 accumulation where the CPU has it, remat_policy, ...).

    Parameters: gate [H, E] (replicated on every rank), wi0 / wi1
    [E_l, H, F] and wo [E_l, F, H] (this rank's experts); a buffer bias [E]
    (zeros) for router="sigmoid_grouped", its selection-only bias.
    Initialised by reset_parameters(seed): the gate from seed, expert e's
    weights from (seed, e) alone, so every rank count gives the same model.

    Gradients: after backward, gate.grad is this rank's tokens' part of the
    gate's gradient. The gate is replicated, so the caller all-reduces
    (sums) gate.grad over the ranks before the optimizer step, as it does
    for every data-parallel replicated parameter. The experts' gradients
    are complete on their rank (every rank's tokens routed to them
    contributed), so they need no reduction. The loss each rank
    differentiates must be its share of the global loss (e.g. its tokens'
    sum divided by the global token count).

    forward(x): x [..., H] float32 on the CPU (this rank's tokens) -> y of
    x's shape. The routing of the last forward is kept as last_topk_ids /
    last_topk_weights [N, K]."""

    def __init__(self, group: EpGroup, ffn: int, seed: int = 0, **keys):
        super().__init__()
        self.group = group
        self.layer = _RankLayer(group, ffn, **keys)
        h, f, e, local = group.hidden, ffn, group.num_experts, self.layer.num_local_experts
        self.gate = torch.nn.Parameter(torch.empty(h, e))
        self.wi0 = torch.nn.Parameter(torch.empty(local, h, f))
        self.wi1 = torch.nn.Parameter(torch.empty(local, h, f))
        self.wo = torch.nn.Parameter(torch.empty(local, f, h))
        if self.layer.router == "sigmoid_grouped":
            self.register_buffer("bias", torch.zeros(e))
        else:
            self.bias = None
        self.last_topk_ids = self.last_topk_weights = None
        self.reset_parameters(seed)

    @property
    def first_expert(self) -> int:
        return self.group.first_local_expert

    def reset_parameters(self, seed: int = 0) -> None:
        """gate ~ N(0, 1/H) from `seed`; expert e's wi0, wi1 ~ N(0, 1/H) and
        wo ~ N(0, 1/F), drawn in that order from a generator seeded by (seed, e)."""
        h, f = self.wi0.shape[1], self.wi0.shape[2]
        with torch.no_grad():
            generator = torch.Generator().manual_seed(seed)
            self.gate.copy_(torch.randn(self.gate.shape, generator=generator) * h**-0.5)
            for local in range(self.wi0.shape[0]):
                generator = torch.Generator().manual_seed(_expert_seed(seed, self.first_expert + local))
                self.wi0[local].copy_(torch.randn((h, f), generator=generator) * h**-0.5)
                self.wi1[local].copy_(torch.randn((h, f), generator=generator) * h**-0.5)
                self.wo[local].copy_(torch.randn((f, h), generator=generator) * f**-0.5)

    def forward(self, x):
        tokens = x.reshape(-1, x.shape[-1])
        y, self.last_topk_ids, self.last_topk_weights = _MoeFunction.apply(
            self.layer, tokens.contiguous(), self.gate, self.wi0, self.wi1, self.wo, self.bias)
        return y.reshape(x.shape)

    def extra_repr(self) -> str:
        g = self.group
        return (f"hidden={g.hidden}, ffn={self.layer.ffn}, num_experts={g.num_experts}, top_k={g.top_k}, "
                f"local_experts=[{g.first_local_expert}, {g.first_local_expert + g.num_local_experts}), "
                f"rank={g.rank}/{g.size}, dispatch={g.dispatch_kind}, router={self.layer.router}, "
                f"compute_dtype={self.layer.compute_dtype}")


Dispatched = namedtuple("Dispatched", "rows num_rows_per_expert row_weights handle")


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group: EpGroup, x, topk_ids, topk_weights):
        d = group.dispatch(x.detach(), topk_ids.detach(), topk_weights.detach())
        ctx.group, ctx.handle = group, d.handle
        ctx.mark_non_differentiable(d.num_rows_per_expert)
        return d.rows, d.num_rows_per_expert, d.row_weights, d.handle

    @staticmethod
    @once_differentiable
    def backward(ctx, d_rows, _d_counts, d_row_weights, _d_handle):
        grads = ctx.group.dispatch_backward(ctx.handle, d_rows.contiguous(), d_row_weights.contiguous())
        return None, grads.dx, None, grads.d_topk_weights


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group: EpGroup, handle, expert_outputs, row_weights):
        outputs = expert_outputs.detach().contiguous()
        ctx.group, ctx.handle, ctx.expert_outputs = group, handle, outputs
        return group.combine(handle, outputs)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        grads = ctx.group.combine_backward(ctx.handle, dy.contiguous(), ctx.expert_outputs)
        del ctx.expert_outputs
        return None, None, grads.d_expert_outputs, grads.d_row_weights


def dispatch(group: EpGroup, x, topk_ids, topk_weights) -> Dispatched:
    """The rows each local expert computes: x [N_l, H] float32,
    topk_ids [N_l, K] int32 (physical expert ids; torch's topk gives int64:
    pass .int()), topk_weights [N_l, K] float32, differentiable in x and
    topk_weights. Returns Dispatched(rows [num_rows, H] sorted by local
    expert, num_rows_per_expert [experts_per_rank] int64, row_weights
    [num_rows], handle). Give the rows' expert outputs, the handle and these
    row_weights to combine()."""
    return Dispatched(*_Dispatch.apply(group, x, topk_ids, topk_weights))


def combine(group: EpGroup, handle, expert_outputs, row_weights):
    """y [N_l, H]: every token's rows' expert_outputs [num_rows, H] (in the
    dispatched rows' order) summed with their routing weights.
    row_weights must be dispatch's own (the weights combine applies are the
    handle's; passing them here carries their gradient back to
    topk_weights through dispatch's backward)."""
    return _Combine.apply(group, handle, expert_outputs, row_weights)
