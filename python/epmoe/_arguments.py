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
