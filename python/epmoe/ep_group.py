"""epmoe.EpGroup: one rank's member of an expert-parallel group, made once
per rank on a communicator the caller owns and shared by every MoE layer of
the model (<epmoe/ep_group.h>).

    comm = epmoe.mpi_communicator(MPI.COMM_WORLD)        # or ThreadsWorld(R).communicator(r)
    group = epmoe.EpGroup(comm, num_experts=16, top_k=2, hidden=1024, dispatch="ring", token_chunks=2)

Construction is collective: every rank makes its group at the same point
and the ranks compare their configurations, so a rank made with another
num_experts, top_k, hidden, dispatch or any other group key is refused on
every rank with a ValueError naming the rank and the key (never a hang).
Keys: the group's keys of `epmoe layer` (dispatch, dedup, capacity_factor,
token_chunks, fp8_tokens, wire_dtype, cotangent_all_gather, balance, redundant_slots,
rebalance_threshold, replica_costs, balance_window, balance_period, replica_choice,
comm_timeout_ms); a layer's key (router, compute_dtype, ...) is refused,
naming where it belongs (epmoe.MoeLayer). wire_dtype="auto" means f32
here (the group does not know its layers' compute_dtype): pass
wire_dtype="bf16" for bf16 combine outputs, cotangents and dx.
replica_costs="priced" (the default) prices replicas as `epmoe layer` does
on the same keys: the wall clock at the calling thread's compute threads
(run_threads gives each rank max(1, cores // R), as `epmoe layer ranks=R`
does; under mpirun, OMP_NUM_THREADS), so both plan the same replicas.
replica_costs="measured" prices at rates the ranks measure at the first
plan instead (docs/BALANCE.md, Rates): plans then follow the machine's timing.

Dispatch and combine without the experts, for callers with their own
expert compute (DeepEP's dispatch / combine; epmoe.torch.dispatch and
combine are the autograd form):

    d = group.dispatch(x, topk_ids, topk_weights)        # rows sorted by local expert
    y = group.combine(d.handle, my_experts(d.rows, d.num_rows_per_expert))
    gc = group.combine_backward(d.handle, dy, expert_outputs)
    gd = group.dispatch_backward(d.handle, d_rows, gc.d_row_weights)   # ends the step

x [N_l, H] float32, topk_ids [N_l, K] int32 (physical expert ids: rank r
holds [r * experts_per_rank, (r + 1) * experts_per_rank)), topk_weights
[N_l, K] float32, all C-contiguous CPU numpy arrays or torch tensors, read
in place (x until the step ends); outputs of the inputs' kind. A call out
of the order dispatch, combine, combine_backward, dispatch_backward raises
epmoe.UsageError naming it. The GIL is released while a call computes or
communicates.
"""

from __future__ import annotations

from collections import namedtuple

from . import _epmoe
from ._arguments import as_kind, keys_text, new_array, torch_tensor_module
from .communicators import communicator_of

__all__ = ["EpGroup", "DispatchHandle", "Dispatched", "CombineGradients", "DispatchGradients"]

DispatchHandle = _epmoe.DispatchHandle  # one dispatch-only step: from dispatch to dispatch_backward

Dispatched = namedtuple("Dispatched", "rows num_rows_per_expert row_weights handle")
Dispatched.__doc__ = """A dispatch's result: rows [num_rows, H] sorted by local expert,
num_rows_per_expert [experts_per_rank] int64, row_weights [num_rows] (each row's
routing weight) and the step's handle for combine and both backwards."""
CombineGradients = namedtuple("CombineGradients", "d_expert_outputs d_row_weights")
DispatchGradients = namedtuple("DispatchGradients", "dx d_topk_weights")


class EpGroup:
    """One rank's member of an EP group (see the module's docstring).

    communicator: an epmoe.Communicator, an mpi4py communicator (made into
    one by epmoe.mpi_communicator), or None for one rank holding every
    expert with no communication (dispatch, dedup, fp8 and replicas then do
    not apply and are refused)."""

    def __init__(self, communicator, num_experts: int, top_k: int, hidden: int, **keys):
        self.communicator = communicator_of(communicator, "EpGroup")
        self._group = _epmoe.EpGroup(self.communicator, num_experts, top_k, hidden, keys_text(keys))

    rank = property(lambda self: self._group.rank)
    size = property(lambda self: self._group.size)
    num_experts = property(lambda self: self._group.num_experts)
    top_k = property(lambda self: self._group.top_k)
    hidden = property(lambda self: self._group.hidden)
    dispatch_kind = property(lambda self: self._group.dispatch_kind)
    num_local_experts = property(lambda self: self._group.num_local_experts, doc="E / R: the rank's home experts")
    first_local_expert = property(lambda self: self._group.first_local_expert)
    experts_per_rank = property(lambda self: self._group.experts_per_rank,
                                doc="E / R, plus the replica slots when configured")
    buffer_bytes = property(lambda self: self._group.buffer_bytes,
                            doc="bytes of the exchange buffers the group keeps across steps")

    def dispatch(self, x, topk_ids, topk_weights) -> Dispatched:
        torch = torch_tensor_module(x)
        rows, counts, row_weights, handle = self._group.dispatch(x, topk_ids, topk_weights)
        return Dispatched(as_kind(torch, rows), as_kind(torch, counts), as_kind(torch, row_weights), handle)

    def combine(self, handle, expert_outputs, out=None):
        """y [N_l, H] = the sum over each token's rows of weight x expert output;
        into `out` when given."""
        if out is None:
            out = new_array(torch_tensor_module(expert_outputs), (self._num_tokens(handle), self.hidden), "float32")
        return self._group.combine(handle, expert_outputs, out)

    def combine_backward(self, handle, dy, expert_outputs) -> CombineGradients:
        torch = torch_tensor_module(dy)
        d_outputs, d_weights = self._group.combine_backward(handle, dy, expert_outputs)
        return CombineGradients(as_kind(torch, d_outputs), as_kind(torch, d_weights))

    def dispatch_backward(self, handle, d_rows, d_row_weights) -> DispatchGradients:
        torch = torch_tensor_module(d_rows)
        dx, d_topk_weights = self._group.dispatch_backward(handle, d_rows, d_row_weights)
        return DispatchGradients(as_kind(torch, dx), as_kind(torch, d_topk_weights))

    def _num_tokens(self, handle):
        return handle.num_tokens
