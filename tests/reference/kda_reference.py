#!/usr/bin/python3
"""Independent PyTorch reference for the olmosft KDA kernels (docs/reference/architecture.md B.4 and C.1).

Written from the math, not from fla's kernels: short causal depthwise conv + SiLU per document, L2 norm per
head (eps inside the sqrt), gate g = -exp(A_log) * softplus(f + dt_bias), beta = 2*sigmoid(b), the naive
token-by-token delta-rule recurrence with the state reset at every document start, and the sigmoid-gated
output RMSNorm. torch autograd gives every gradient. Everything runs in float64.

Writes tests/golden/kda/kda_golden.bin (little-endian float64 tensors, concatenated) and
tests/golden/kda/kda_golden.json (config, segment ids, and name -> {shape, offset (in doubles)}).
Run: /usr/bin/python3 tests/reference/kda_reference.py
"""
import json
import math
import os
import tempfile

import torch
import torch.nn.functional as F

T, H, DK, DV, KCONV = 50, 2, 16, 32, 4
DOCS = [21, 3, 21]  # the 3-token document is shorter than the conv kernel
PAD = T - sum(DOCS)  # 5 padding tokens at the end (segment id -1)
EPS_L2, EPS_NORM = 1e-6, 1e-5
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden", "kda")


def segments():
    seg = []
    for i, n in enumerate(DOCS):
        seg += [i] * n
    return seg + [-1] * PAD


def doc_slices():
    out, t = [], 0
    for n in DOCS:
        out.append((t, t + n))
        t += n
    return out


def conv_silu(x, w):
    """x [T, C], w [C, 1, K]: causal depthwise conv within each document, then SiLU; padding -> 0."""
    y = torch.zeros_like(x)
    for a, b in doc_slices():
        xs = x[a:b].t().unsqueeze(0)  # [1, C, n]
        c = F.conv1d(xs, w, groups=x.shape[1], padding=KCONV - 1)[..., : b - a]
        y[a:b] = F.silu(c[0].t())
    return y


def l2norm(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + EPS_L2)


def recurrent_kda(q, k, v, g, beta, scale):
    """q, k, g [T, H, DK]; v [T, H, DV]; beta [T, H]. State reset per document; padding output 0."""
    outs = [torch.zeros(1, H, DV, dtype=v.dtype)] * T
    for a, b in doc_slices():
        S = torch.zeros(H, DK, DV, dtype=v.dtype)
        for t in range(a, b):
            S = S * torch.exp(g[t])[..., None]
            pred = (S * k[t][..., None]).sum(1)  # S^T k  [H, DV]
            u = beta[t][:, None] * (v[t] - pred)
            S = S + k[t][..., None] * u[:, None, :]
            outs[t] = ((scale * q[t])[..., None] * S).sum(1).unsqueeze(0)
    return torch.cat(outs, 0)


def main():
    torch.manual_seed(0)
    dt = torch.float64
    leaf = {
        "q_in": torch.randn(T, H * DK, dtype=dt),
        "k_in": torch.randn(T, H * DK, dtype=dt),
        "v_in": torch.randn(T, H * DV, dtype=dt),
        "q_conv_w": 0.5 * torch.randn(H * DK, 1, KCONV, dtype=dt),
        "k_conv_w": 0.5 * torch.randn(H * DK, 1, KCONV, dtype=dt),
        "v_conv_w": 0.5 * torch.randn(H * DV, 1, KCONV, dtype=dt),
        "f": torch.randn(T, H * DK, dtype=dt),
        "A_log": torch.log(torch.empty(H, dtype=dt).uniform_(1.0, 16.0)),
        "dt_bias": 0.5 * torch.randn(H * DK, dtype=dt),
        "b": torch.randn(T, H, dtype=dt),
        "z": torch.randn(T, H * DV, dtype=dt),
        "o_norm_w": 1.0 + 0.1 * torch.randn(DV, dtype=dt),
    }
    dy = torch.randn(T, H * DV, dtype=dt)
    for x in leaf.values():
        x.requires_grad_(True)

    qc = conv_silu(leaf["q_in"], leaf["q_conv_w"])
    kc = conv_silu(leaf["k_in"], leaf["k_conv_w"])
    vc = conv_silu(leaf["v_in"], leaf["v_conv_w"])
    qn = l2norm(qc.view(T, H, DK))
    kn = l2norm(kc.view(T, H, DK))
    g = -torch.exp(leaf["A_log"])[None, :, None] * F.softplus(leaf["f"].view(T, H, DK) + leaf["dt_bias"].view(H, DK))
    beta = 2.0 * torch.sigmoid(leaf["b"])
    o = recurrent_kda(qn, kn, vc.view(T, H, DV), g, beta, DK ** -0.5)
    rstd = torch.rsqrt((o * o).mean(-1, keepdim=True) + EPS_NORM)
    y = (o * rstd * leaf["o_norm_w"] * torch.sigmoid(leaf["z"].view(T, H, DV))).reshape(T, H * DV)
    inter = {"qc": qc, "kc": kc, "vc": vc, "qn": qn, "kn": kn, "g": g, "beta": beta, "o": o}
    for x in inter.values():
        x.retain_grad()
    (y * dy).sum().backward()

    tensors = {}
    for name, x in leaf.items():
        tensors[name] = x.detach()
        tensors["d_" + name] = x.grad.detach()
    for name, x in inter.items():
        tensors[name] = x.detach()
        tensors["d_" + name] = x.grad.detach()
    tensors["y"] = y.detach()
    tensors["dy"] = dy

    manifest = {
        "generator": "tests/reference/kda_reference.py (torch %s, float64)" % torch.__version__,
        "T": T, "H": H, "DK": DK, "DV": DV, "conv_kernel": KCONV, "eps_l2": EPS_L2, "eps_norm": EPS_NORM,
        "scale": DK ** -0.5, "allow_neg_eigval": True, "segments": segments(), "tensors": {},
    }
    blobs, off = [], 0
    for name in sorted(tensors):
        x = tensors[name].contiguous().to(torch.float64)
        manifest["tensors"][name] = {"shape": list(x.shape), "offset": off}
        blobs.append(x.numpy().astype("<f8").tobytes())
        off += x.numel()
    os.makedirs(OUT, exist_ok=True)
    for fname, data in (("kda_golden.bin", b"".join(blobs)),
                        ("kda_golden.json", (json.dumps(manifest) + "\n").encode())):
        fd, tmp = tempfile.mkstemp(dir=OUT)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(OUT, fname))
    print("kda_reference: wrote %d tensors (%d doubles) to %s" % (len(tensors), off, os.path.normpath(OUT)))


if __name__ == "__main__":
    main()
