#!/usr/bin/env python3
"""Fixtures for RoPE / YaRN, written from the HF transformers definition (_compute_default_rope_parameters,
_compute_yarn_parameters, the rotary embedding forward and apply_rotary_pos_emb), all in float32 as HF runs
them (inv_freq, angles pos * inv_freq, cos/sin times attention_scaling, x * cos + rotate_half(x) * sin).
The backward reference is torch autograd in float64 through the same (float32-derived) cos/sin tables.
Run: /usr/bin/python3 tests/reference/kernels_rope.py
"""
import math

import torch

from kernels_common import flat, rand32, write


def default_inv_freq(base, dim):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim)), 1.0


def yarn_inv_freq(base, dim, max_pos, rs):
    factor = rs["factor"]
    attention_factor = rs.get("attention_factor")
    mscale = rs.get("mscale")
    mscale_all_dim = rs.get("mscale_all_dim")
    original = rs.get("original_max_position_embeddings") or max_pos
    if "original_max_position_embeddings" in rs:
        factor = max_pos / original  # HF recomputes the factor from the two context lengths

    def get_mscale(scale, m=1):
        if scale <= 1:
            return 1.0
        return 0.1 * m * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = rs.get("beta_fast") or 32
    beta_slow = rs.get("beta_slow") or 1

    def find_correction_dim(num_rotations):
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    truncate = rs.get("truncate", True)
    low, high = find_correction_dim(beta_fast), find_correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extra = 1.0 / pos_freqs
    inter = 1.0 / (factor * pos_freqs)
    extra_factor = 1 - ramp
    inv = inter * (1 - extra_factor) + extra * extra_factor
    return inv, attention_factor


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def case(name, cfg, T, H, positions, seed):
    g = torch.Generator().manual_seed(seed)
    D, base, max_pos = cfg["head_dim"], cfg["rope_theta"], cfg["max_position_embeddings"]
    rs = cfg.get("rope_scaling")
    if rs is None:
        inv, att = default_inv_freq(base, D)
    else:
        inv, att = yarn_inv_freq(base, D, max_pos, rs)
    pos = torch.tensor(positions, dtype=torch.int64)
    freqs = (inv[:, None].float() @ pos[None, :].float()).transpose(0, 1)  # [T, D/2], float32
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * att, emb.sin() * att
    x, r = rand32(g, T, H, D), rand32(g, T, H, D)
    y32 = x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]
    xd = x.double().requires_grad_()
    yd = xd * cos.double()[:, None, :] + rotate_half(xd) * sin.double()[:, None, :]
    (yd * r.double()).sum().backward()
    return {"name": name, "config": cfg, "T": T, "H": H, "D": D, "positions": positions, "inv_freq": flat(inv),
            "attention_scaling": att, "cos_half": flat(cos[:, : D // 2]), "sin_half": flat(sin[:, : D // 2]),
            "x": flat(x), "dy": flat(r), "y32": flat(y32), "y64": flat(yd), "dx": flat(xd.grad)}


olmo3_7b = {"head_dim": 128, "rope_theta": 500000.0, "max_position_embeddings": 65536,
            "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192,
                             "beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": 1.2079441541679836}}
olmo3_7b_default = {"head_dim": 128, "rope_theta": 500000.0, "max_position_embeddings": 65536, "rope_scaling": None}
tiny = {"head_dim": 16, "rope_theta": 500000.0, "max_position_embeddings": 512,
        "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64,
                         "beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": 1.2079441541679836}}
# No attention_factor (default 0.1 ln(factor) + 1), no original (factor used as given), no truncation.
yarn_plain = {"head_dim": 32, "rope_theta": 10000.0, "max_position_embeddings": 4096,
              "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "truncate": False}}

packed = list(range(5)) + list(range(3)) + [8191, 8192, 65535]  # positions restart per document
cases = [
    case("olmo3_7b_yarn", olmo3_7b, len(packed), 1, packed, 1),
    case("olmo3_7b_default", olmo3_7b_default, len(packed), 1, packed, 2),
    case("tiny_yarn", tiny, 6, 4, [0, 1, 2, 100, 0, 511], 3),
    case("yarn_plain", yarn_plain, 4, 3, [0, 7, 3000, 1], 4),
]
write("rope.json", {"generator": "tests/reference/kernels_rope.py", "torch": torch.__version__, "cases": cases})
