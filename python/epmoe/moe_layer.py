"""epmoe.MoeLayer: one rank's routed MoE layer on an epmoe.EpGroup
(<epmoe/moe_layer.h>), y = sum_k w_k expert_{id_k}(x) with SwiGLU experts,
forward and backward, inside the caller's own process: each rank runs its
own layer on its own tokens with its own experts' weights.

    group = epmoe.EpGroup(comm, num_experts=8, top_k=2, hidden=64)
    layer = epmoe.MoeLayer(group, ffn=128, router="softmax_topk")
    out = layer.forward(x, gate, wi0, wi1, wo)           # out.y, out.topk_ids, out.topk_weights
    grads = layer.backward(dy)                           # grads.dx, dgate, dwi0, dwi1, dwo

x [N, H] is this rank's tokens; gate [H, E] is replicated, so grads.dgate
is this rank's part (sum it over ranks, as any replicated parameter's);
wi0, wi1 [E_l, H, F] and wo [E_l, F, H] are this rank's E_l = E / R
experts, [rank * E_l, (rank + 1) * E_l). The backward uses what its forward
kept (the dispatch layout, x_sorted and the activations the remat policy
saves): nothing is recomputed but what that policy says.

Split phase, and several steps in flight (micro-batches):

    a = layer.begin_forward(x_a, gate, wi0, wi1, wo)     # routed, chunk 0 in flight
    out_a = layer.finish_forward(a)
    layer.begin_backward(a, dy_a)
    grads_a = layer.finish_backward(a)                   # ends the step

A call out of that order raises epmoe.UsageError naming it, leaving the step
as it was. Arrays: float32 (topk_ids int32), C-contiguous, on the CPU, numpy
or torch, read in place (x and the weights until the step's
finish_backward, the usual autograd contract) or refused with a TypeError
naming the argument; outputs are new arrays of x's kind, or the caller's
own through out= (a ForwardOutput / Gradients of arrays to write into).
Layer keys: those of `epmoe layer` for a layer (router, norm_topk_prob,
n_groups, topk_groups, routed_scaling_factor, compute_dtype, seed,
remat_policy, remat.<name>); top_k is the group's. The GIL is released
while a call computes or communicates.
"""

from __future__ import annotations

from collections import namedtuple

from . import _epmoe
from ._arguments import as_kind, keys_text, new_array, torch_tensor_module
from .ep_group import EpGroup

__all__ = ["MoeLayer", "MoeStep", "ForwardOutput", "Gradients"]

ForwardOutput = namedtuple("ForwardOutput", "y topk_ids topk_weights")
Gradients = namedtuple("Gradients", "dx dgate dwi0 dwi1 dwo")


def _of_kind(torch, given, results):
    """The results, those epmoe allocated (where `given` had None) as torch tensors when x was one."""
    return (as_kind(torch, r) if g is None else r for g, r in zip(given, results))


class MoeStep:
    """One step of one layer, from begin_forward to finish_backward."""

    __slots__ = ("_step", "_torch")

    def __init__(self, step, torch):
        self._step = step
        self._torch = torch  # the torch module when x was a tensor: outputs follow x's kind

    @property
    def active(self) -> bool:
        """Begun and not yet ended (by finish_backward, an error, or being dropped)."""
        return self._step.active

    @property
    def num_tokens(self) -> int:
        return self._step.num_tokens


class MoeLayer:
    """One rank's MoE layer on `group` (see the module's docstring)."""

    def __init__(self, group: EpGroup, ffn: int, **keys):
        if not isinstance(group, EpGroup):
            raise TypeError(f"MoeLayer: group must be an epmoe.EpGroup, got {type(group).__name__}")
        self.group = group
        self._layer = _epmoe.MoeLayer(group._group, ffn, keys_text(keys))
        self._step: MoeStep | None = None  # forward()'s, for backward()

    num_local_experts = property(lambda self: self._layer.num_local_experts)
    ffn = property(lambda self: self._layer.ffn)
    compute_dtype = property(lambda self: self._layer.compute_dtype)
    router = property(lambda self: self._layer.router)

    def begin_forward(self, x, gate, wi0, wi1, wo, bias=None, weight_version=None,
                      random_router_stream=None) -> MoeStep:
        """Checks the inputs, routes, and starts the dispatch.

        weight_version: identifies the expert weights' values, the same on
        every rank (replica slots are not resent while it and the buffers are
        unchanged); None: a new version every call. random_router_stream
        (router="random"): the stream of the router's seed this step draws
        from, e.g. a function of (step, layer, rank) so that a resumed run
        draws what an uninterrupted one would; None: the layer's generator
        goes on."""
        return MoeStep(self._layer.begin_forward(x, gate, wi0, wi1, wo, bias, weight_version, random_router_stream),
                       torch_tensor_module(x))

    def finish_forward(self, step: MoeStep, out: ForwardOutput | None = None) -> ForwardOutput:
        """The experts and the combine: y [N, H], topk_ids [N, K] int32, topk_weights [N, K]."""
        if out is None:
            n, k, torch = step._step.num_tokens, self.group.top_k, step._torch
            out = ForwardOutput(new_array(torch, (n, self.group.hidden), "float32"),
                                new_array(torch, (n, k), "int32"), new_array(torch, (n, k), "float32"))
        return ForwardOutput(*_of_kind(step._torch, out, self._layer.finish_forward(step._step, *out)))

    def begin_backward(self, step: MoeStep, dy, extra_d_logits=None) -> None:
        """Checks dy [N, H] and starts sending the cotangents. extra_d_logits
        [N, E]: a gradient of the router logits from a loss outside the layer."""
        self._layer.begin_backward(step._step, dy, extra_d_logits)

    def finish_backward(self, step: MoeStep, out: Gradients | None = None) -> Gradients:
        """The experts' backward, the gradients' return and the router's backward; ends the step."""
        if out is None:
            out = self.new_gradients(step._step.num_tokens, step._torch)
        return Gradients(*_of_kind(step._torch, out, self._layer.finish_backward(step._step, *out)))

    def new_gradients(self, num_tokens: int, torch=None) -> Gradients:
        """Uninitialised arrays for a step's gradients (numpy, or torch tensors when `torch` is the module)."""
        h, f, e, local = self.group.hidden, self.ffn, self.group.num_experts, self.num_local_experts
        return Gradients(new_array(torch, (num_tokens, h), "float32"), new_array(torch, (h, e), "float32"),
                         new_array(torch, (local, h, f), "float32"), new_array(torch, (local, h, f), "float32"),
                         new_array(torch, (local, f, h), "float32"))

    def forward(self, x, gate, wi0, wi1, wo, bias=None, out: ForwardOutput | None = None, *,
                weight_version=None, random_router_stream=None) -> ForwardOutput:
        """begin_forward and finish_forward; the step is kept for backward()
        (a later forward() drops it: inference)."""
        self._step = None  # with replicas a layer holds one step at a time
        step = self.begin_forward(x, gate, wi0, wi1, wo, bias, weight_version, random_router_stream)
        result = self.finish_forward(step, out)
        self._step = step
        return result

    def backward(self, dy, out: Gradients | None = None) -> Gradients:
        """The backward of the last forward()'s step."""
        step = self._step
        if step is None:
            raise _epmoe.UsageError("MoeLayer.backward(): no forward() step under way: call forward() first "
                                    "(or use begin_forward / finish_forward / begin_backward / finish_backward)")
        self.begin_backward(step, dy)  # a refused dy leaves the step for a corrected call
        self._step = None
        return self.finish_backward(step, out)

    def phase_seconds(self) -> dict:
        """Seconds per phase (route, dispatch, experts, combine, backward_*), accumulated over steps."""
        return self._layer.phase_seconds()

    def last_step_stats(self) -> dict:
        """The last step's bytes sent per collective, rows per local expert, and replica statistics:
        the plan (slots, loads before and after) and, with balance="dynamic", the cost model's verdict
        (predicted_saving_us / predicted_cost_us of what it placed, refused_replicas / refused_saving_us /
        refused_cost_us of what it refused, skipped_planning, priced_at), named as in `epmoe layer`'s
        metrics.json "balance"."""
        return self._layer.last_step_stats()
