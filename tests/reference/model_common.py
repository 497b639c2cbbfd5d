"""Shared helpers for the olmosft model reference scripts (model_olmo3.py, model_olmo3moe.py).

Everything here is plain PyTorch (Debian python3-torch 1.13) + numpy; no transformers/safetensors packages.
"""
import json
import math
import os

import numpy as np
import torch

import model_safetensors as st

# Determinism: single-threaded BLAS/ATen so reductions are always done in the same order.
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

IGNORE = -100


# ----------------------------------------------------------------------------------------------- init
class Init:
    """Seeded weight generator: numpy's legacy MT19937 RandomState (stable across numpy versions).
    Values are generated in float64 and rounded once to float32, so the f32 weights are the canonical
    weights; the float64 reference runs on exactly the same (f32-representable) values."""

    def __init__(self, seed):
        self.rs = np.random.RandomState(seed)

    def normal(self, shape, std=1.0, mean=0.0):
        a = self.rs.standard_normal(size=shape) * std + mean
        return torch.from_numpy(a.astype(np.float32))

    def uniform(self, shape, lo, hi):
        a = self.rs.uniform(lo, hi, size=shape)
        return torch.from_numpy(a.astype(np.float32))

    def randint(self, lo, hi, n):
        return [int(x) for x in self.rs.randint(lo, hi, size=n)]


# ------------------------------------------------------------------------------------------- math bits
def rmsnorm(x, w, eps):
    """HF Olmo RMSNorm: y = w * (x * rsqrt(mean(x^2) + eps)) (mean over the last axis)."""
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def swiglu(x, wg, wu, wd):
    return torch.nn.functional.linear(
        torch.nn.functional.silu(torch.nn.functional.linear(x, wg)) * torch.nn.functional.linear(x, wu), wd
    )


def linear(x, w, b=None):
    return torch.nn.functional.linear(x, w, b)


# -------------------------------------------------------------------------------------------- batches
def pack_rows(doc_lengths_per_row, T, init, vocab, eos_id, first_id=2, prompt_frac=(0.2, 0.5)):
    """Build a packed batch.  Each document = random ids in [first_id, vocab) followed by one EOS.
    segment ids are 1-based per row (k-th document of a row -> k), positions restart at 0 per document.
    label_mask[t] = 1 iff token t is a trainable *target* token (the document's completion part: the last
    ceil((1-frac)*len) tokens, which always includes the final EOS; the first token is never trainable).
    Returns dict of int tensors plus the document list [(row, start, length)]."""
    B = len(doc_lengths_per_row)
    tokens = torch.zeros(B, T, dtype=torch.int32)
    seg = torch.zeros(B, T, dtype=torch.int32)
    pos = torch.zeros(B, T, dtype=torch.int32)
    label_mask = torch.zeros(B, T, dtype=torch.uint8)
    docs = []
    for b, lens in enumerate(doc_lengths_per_row):
        if sum(lens) != T:
            raise ValueError(f"row {b}: document lengths {lens} do not sum to T={T}")
        start = 0
        for k, L in enumerate(lens):
            ids = init.randint(first_id, vocab, L - 1) + [eos_id]
            tokens[b, start : start + L] = torch.tensor(ids, dtype=torch.int32)
            seg[b, start : start + L] = k + 1
            pos[b, start : start + L] = torch.arange(L, dtype=torch.int32)
            frac = prompt_frac[0] + (prompt_frac[1] - prompt_frac[0]) * init.rs.uniform()
            n_prompt = max(1, min(L - 1, int(round(frac * L)))) if L > 1 else 1
            label_mask[b, start + n_prompt : start + L] = 1
            docs.append((b, start, L))
            start += L
    return dict(input_ids=tokens, segment_ids=seg, position_ids=pos, label_mask=label_mask), docs


def make_targets(batch):
    """targets[b,t] = input_ids[b,t+1] if token t+1 is in the same document, else IGNORE (-100): the last
    token of every document (and of the row) has no target.  loss_mask[b,t] = 1 iff targets[b,t] is valid
    AND label_mask[b,t+1] (the target token is trainable)."""
    ids, seg, lm = batch["input_ids"], batch["segment_ids"], batch["label_mask"]
    B, T = ids.shape
    targets = torch.full((B, T), IGNORE, dtype=torch.int32)
    loss_mask = torch.zeros(B, T, dtype=torch.uint8)
    same = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)
    targets[:, :-1] = torch.where(same, ids[:, 1:], torch.full_like(ids[:, 1:], IGNORE))
    loss_mask[:, :-1] = (same & (lm[:, 1:] != 0)).to(torch.uint8)
    return targets, loss_mask


def doc_mask(seg):
    """[B,T,T] bool: key j visible to query i iff same (non-zero) segment and j <= i."""
    T = seg.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] != 0)
    return same & causal[None]


def lm_loss(logits, targets, loss_mask, z_coef):
    """Token-mean CE over trained targets + z_coef * mean(lse^2) over the same targets.
    Returns dict(total, ce, z (already multiplied by z_coef), z_raw (mean lse^2), lse [B,T], logprob [B,T],
    n_trained)."""
    lse = torch.logsumexp(logits, dim=-1)
    tgt = targets.long().clamp_min(0)
    zt = logits.gather(-1, tgt[..., None])[..., 0]
    logprob = torch.where(targets >= 0, zt - lse, torch.zeros_like(lse))
    m = loss_mask.to(logits.dtype)
    n = m.sum()
    ce = ((lse - zt) * m).sum() / n
    z_raw = (lse.pow(2) * m).sum() / n
    z = z_coef * z_raw
    return dict(total=ce + z, ce=ce, z=z, z_raw=z_raw, lse=lse, logprob=logprob, n_trained=int(n.item()))


# ----------------------------------------------------------------------------------------------- misc
def count_params(params):
    return sum(p.numel() for p in params.values()), len(params)


def sig3(x):
    """Round to 3 significant digits (keeps measured-tolerance numbers stable across BLAS builds)."""
    x = float(x)
    if x == 0.0 or not math.isfinite(x):
        return x
    return float(f"{x:.3g}")


def discrepancy(ref64, got32):
    """max |f32 - f64| and the same divided by max |f64| (scale-relative)."""
    d = (got32.double() - ref64.double()).abs().max().item()
    s = ref64.double().abs().max().item()
    return dict(max_abs=sig3(d), max_abs_over_max_ref=sig3(d / s) if s > 0 else 0.0)


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.write("\n")


def save_st(path, tensors, metadata=None):
    st.save(path, tensors, metadata)


def f32(t):
    return t.detach().to(torch.float32).contiguous()


def ensure_dir(d):
    os.makedirs(d, exist_ok=True)
