"""Argument helpers shared by the package's modules."""

from __future__ import annotations

import sys

import numpy as np


def torch_tensor_module(value):
    """torch, when `value` is a torch.Tensor (torch already imported by the caller), else None."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return torch
    return None


def key_text(name, value):
    """A key's value as epmoe's key=value text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str, np.integer, np.floating)):
        return str(value)
    raise TypeError(f"{name}: expected a bool, number or string, got {type(value).__name__}")


def keys_text(keys: dict) -> dict:
    """Keyword arguments as epmoe's key=value texts ({"dedup": "true", ...})."""
    return {name: key_text(name, value) for name, value in keys.items()}


def new_array(torch, shape, dtype: str):
    """An uninitialised float32 / int32 array of the caller's kind: a torch
    tensor when `torch` is the torch module, else a numpy array."""
    if torch is not None:
        return torch.empty(shape, dtype=torch.float32 if dtype == "float32" else torch.int32)
    return np.empty(shape, dtype=np.float32 if dtype == "float32" else np.int32)


def as_kind(torch, array):
    """A numpy array epmoe allocated, as a torch tensor sharing its memory when `torch` is given."""
    return array if torch is None else torch.from_numpy(array)
