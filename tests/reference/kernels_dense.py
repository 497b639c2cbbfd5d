#!/usr/bin/env python3
"""Fixtures for linear (nn.Linear, no bias), RMSNorm (HF Olmo3RMSNorm) and SwiGLU, forward and backward.

Inputs are float32 values; the reference is computed in float64 with torch autograd from those values.
The loss whose gradients are stored is sum(y * r) for a stored random cotangent r.
Run: /usr/bin/python3 tests/reference/kernels_dense.py
"""
import torch
import torch.nn.functional as F

from kernels_common import flat, rand32, write

g = torch.Generator().manual_seed(1234)


def linear_case():
    N, din, dout = 7, 12, 5
    x, W, r = rand32(g, N, din), rand32(g, dout, din, scale=0.3), rand32(g, N, dout)
    xd, Wd = x.double().requires_grad_(), W.double().requires_grad_()
    y = F.linear(xd, Wd)
    (y * r.double()).sum().backward()
    return {"N": N, "in": din, "out": dout, "x": flat(x), "W": flat(W), "dy": flat(r), "y": flat(y),
            "dx": flat(xd.grad), "dW": flat(Wd.grad)}


def rmsnorm_ref(x, w, eps):
    # transformers Olmo3RMSNorm.forward (computed in the input's dtype here: float64)
    var = x.pow(2).mean(-1, keepdim=True)
    y = x * torch.rsqrt(var + eps)
    return y if w is None else w * y


def rmsnorm_case(with_weight):
    N, D, eps = 6, 16, 1e-6
    x, r = rand32(g, N, D, scale=2.0), rand32(g, N, D)
    w = (1.0 + 0.2 * rand32(g, D)) if with_weight else None
    xd = x.double().requires_grad_()
    wd = w.double().requires_grad_() if with_weight else None
    y = rmsnorm_ref(xd, wd, eps)
    (y * r.double()).sum().backward()
    out = {"N": N, "D": D, "eps": eps, "x": flat(x), "dy": flat(r), "y": flat(y), "dx": flat(xd.grad)}
    if with_weight:
        out.update({"w": flat(w), "dw": flat(wd.grad)})
    return out


def swiglu_case():
    n = 40
    a, b, r = rand32(g, n, scale=3.0), rand32(g, n), rand32(g, n)
    ad, bd = a.double().requires_grad_(), b.double().requires_grad_()
    h = F.silu(ad) * bd
    (h * r.double()).sum().backward()
    return {"n": n, "a": flat(a), "b": flat(b), "dh": flat(r), "h": flat(h), "da": flat(ad.grad),
            "db": flat(bd.grad)}


write("dense.json", {"generator": "tests/reference/kernels_dense.py", "torch": torch.__version__,
                     "linear": linear_case(), "rmsnorm_w": rmsnorm_case(True), "rmsnorm_now": rmsnorm_case(False),
                     "swiglu": swiglu_case()})
