"""Shared helpers for the kernels fixture generators (PyTorch reference, float64 unless stated)."""
import json
import os

import torch

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden", "kernels")


def flat(t):
    """A tensor as a flat list of Python floats/ints (float32 values are exact in JSON doubles)."""
    t = t.detach().cpu()
    if t.dtype in (torch.float32, torch.float64):
        return [float(v) for v in t.reshape(-1).double().tolist()]
    return [int(v) for v in t.reshape(-1).tolist()]


def rand32(gen, *shape, scale=1.0):
    """float32 values (so the C++ float path sees exactly the same inputs)."""
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).float()


def write(name, obj):
    os.makedirs(GOLDEN, exist_ok=True)
    path = os.path.join(GOLDEN, name)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
        f.write("\n")
    os.replace(tmp, path)
    print("wrote", path, os.path.getsize(path), "bytes")
