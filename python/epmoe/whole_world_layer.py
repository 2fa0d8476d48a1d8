"""epmoe.WholeWorldLayer: the whole (unsharded) MoE layer, expert parallel
over `ranks` rank threads inside each call, on numpy arrays or CPU torch
tensors, through the same run as `epmoe layer` (so the same bits). For a
layer per rank, inside the caller's own process on a communicator it owns
(mpirun, or a threads world), see epmoe.MoeLayer (moe_layer.py).

    layer = epmoe.WholeWorldLayer(ranks=2, top_k=2, dispatch="ring")
    y, topk_ids, topk_weights = layer.forward(x, gate, wi0, wi1, wo)
    grads = layer.forward_backward(x, gate, wi0, wi1, wo, dy)   # y ... and dx, dgate, dwi0, dwi1, dwo

Inputs are read in place (nanobind ndarray views, no copy in): they must be
float32, C-contiguous and on the CPU, or a TypeError names the argument.
Outputs are new arrays of the inputs' kind (numpy in, numpy out; torch in,
torch out). The GIL is released while the ranks compute.
"""

from __future__ import annotations

import json

from . import _epmoe
from ._arguments import key_text, torch_tensor_module

_ARRAYS = ("x", "gate", "wi0", "wi1", "wo")


def _is_torch(value) -> bool:
    return torch_tensor_module(value) is not None


def _check_array(name: str, value, torch_kind: bool):
    """The array as the binding takes it, refusing what would need a copy."""
    if value is None:
        raise TypeError(f"WholeWorldLayer: {name} is required")
    if torch_kind != _is_torch(value):
        raise TypeError(f"WholeWorldLayer: {name} is a {type(value).__name__} but x is a {'torch tensor' if torch_kind else 'numpy array'}: "
                        "pass every array of one kind")
    if torch_kind:
        if value.device.type != "cpu":
            raise TypeError(f"WholeWorldLayer: {name} is on {value.device}; epmoe runs on the CPU")
        if str(value.dtype) != "torch.float32":
            raise TypeError(f"WholeWorldLayer: {name} has dtype {value.dtype}; epmoe takes float32 (no silent conversion)")
        if not value.is_contiguous():
            raise TypeError(f"WholeWorldLayer: {name} is not contiguous; call .contiguous() (epmoe reads it in place)")
        return value.detach()
    import numpy

    if not isinstance(value, numpy.ndarray):
        raise TypeError(f"WholeWorldLayer: {name} is a {type(value).__name__}; pass a numpy array or a torch tensor")
    if value.dtype != numpy.float32:
        raise TypeError(f"WholeWorldLayer: {name} has dtype {value.dtype}; epmoe takes float32 (no silent conversion)")
    if not value.flags.c_contiguous:
        raise TypeError(f"WholeWorldLayer: {name} is not C-contiguous; use numpy.ascontiguousarray (epmoe reads it in place)")
    return value


def _empty(like_torch: bool, shape, integer: bool = False):
    if like_torch:
        import torch

        return torch.empty(shape, dtype=torch.int32 if integer else torch.float32)
    import numpy

    return numpy.empty(shape, dtype=numpy.int32 if integer else numpy.float32)


class WholeWorldLayer:
    """One routed MoE layer on the whole problem, expert parallel over `ranks` rank threads.

    Keys: every key of `epmoe layer` (`epmoe layer --help`), as keyword
    arguments: ranks, dispatch, top_k, router, dedup, token_chunks,
    fp8_tokens, wire_dtype, balance, redundant_slots, capacity_factor, threads, ... A bad
    key or value raises ValueError naming it."""

    def __init__(self, **keys):
        self._keys = {name: key_text(name, value) for name, value in keys.items()}
        self._layer = _epmoe.WholeWorldLayer(self._keys)
        self._ran = False

    @property
    def metrics(self) -> dict | None:
        """What `epmoe layer` writes to metrics.json, for the last call (None
        before one); made when read, since it costs more than a small call."""
        return json.loads(self._layer.metrics_json()) if self._ran else None

    @property
    def top_k(self) -> int:
        return self._layer.top_k

    def _run(self, x, gate, wi0, wi1, wo, bias, dy):
        torch_kind = _is_torch(x)
        arrays = {name: _check_array(name, value, torch_kind)
                  for name, value in zip(_ARRAYS, (x, gate, wi0, wi1, wo))}
        if bias is not None:
            arrays["bias"] = _check_array("bias", bias, torch_kind)
        if dy is not None:
            arrays["dy"] = _check_array("dy", dy, torch_kind)
        for name in _ARRAYS:
            if len(arrays[name].shape) != (2 if name in ("x", "gate") else 3):
                raise ValueError(f"WholeWorldLayer: {name} has shape {tuple(arrays[name].shape)}; expected "
                                 + ("[N, H]" if name == "x" else "[H, E]" if name == "gate" else "[E, H, F] or [E, F, H]"))
        n, h = arrays["x"].shape
        e = arrays["gate"].shape[1] if len(arrays["gate"].shape) == 2 else 0
        f = arrays["wi0"].shape[2]
        k = self.top_k
        outputs = {"y": _empty(torch_kind, (n, h)), "topk_ids": _empty(torch_kind, (n, k), integer=True),
                   "topk_weights": _empty(torch_kind, (n, k))}
        if dy is not None:
            outputs.update(dx=_empty(torch_kind, (n, h)), dgate=_empty(torch_kind, (h, e)),
                           dwi0=_empty(torch_kind, (e, h, f)), dwi1=_empty(torch_kind, (e, h, f)),
                           dwo=_empty(torch_kind, (e, f, h)))
        self._ran = False
        self._layer.run(arrays, outputs)
        self._ran = True
        return outputs

    def forward(self, x, gate, wi0, wi1, wo, bias=None):
        """(y [N, H], topk_ids [N, K] int32, topk_weights [N, K])."""
        out = self._run(x, gate, wi0, wi1, wo, bias, None)
        return out["y"], out["topk_ids"], out["topk_weights"]

    def forward_backward(self, x, gate, wi0, wi1, wo, dy, bias=None) -> dict:
        """The forward and the backward of dy: a dict of y, topk_ids,
        topk_weights, dx, dgate (every rank's part summed), dwi0, dwi1, dwo."""
        return self._run(x, gate, wi0, wi1, wo, bias, dy)
