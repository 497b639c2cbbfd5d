#!/usr/bin/python3
"""Independent PyTorch reference for Olmo 3 dense (HF model_type "olmo3"), written from
docs/reference/architecture.md Part A (A.3 forward, A.4 RoPE/YaRN) -- not from HF code.

  /usr/bin/python3 tests/reference/model_olmo3.py [--out DIR]   write tests/golden/model/olmo3_tiny/
  /usr/bin/python3 tests/reference/model_olmo3.py --check       gradcheck (fp64) + parameter counts
  /usr/bin/python3 tests/reference/model_olmo3.py --bench [--T 2048] [--docs 4] [--iters 3] [--threads 2]
      float32 forward+backward timing of the D.1 small config (used by bench/model_olmo3.cpp); prints one
      JSON line; writes nothing

See docs/model_reference.md for the fixture layout and every convention.
"""
import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_common as mc  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DEFAULT_OUT = os.path.join(REPO, "tests", "golden", "model", "olmo3_tiny")

SEED_WEIGHTS = 20261202
SEED_BATCH = 7
Z_LOSS_COEF = 1e-5  # LM-head z-loss multiplier (SFT recipe value)

# D.1 tiny config, HF config.json format (same keys as the released Olmo-3-7B config; no "head_dim" key,
# so head_dim = hidden_size / num_attention_heads = 16).
TINY_CONFIG = {
    "architectures": ["Olmo3ForCausalLM"],
    "model_type": "olmo3",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-06,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "max_position_embeddings": 512,
    "rope_theta": 500000,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "attention_factor": 1.2079441541679836,
    },
    "sliding_window": 16,
    "layer_types": ["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 + ["full_attention"],
    "tie_word_embeddings": False,
    "eos_token_id": 1,
    "pad_token_id": 0,
    "bos_token_id": None,
    "initializer_range": 0.02,
    "use_cache": True,
    "torch_dtype": "float32",
}
DOCUMENTED_COUNTS = (362304, 91)  # docs/reference/architecture.md D.1


class Cfg:
    def __init__(self, c):
        self.raw = c
        self.V = c["vocab_size"]
        self.d = c["hidden_size"]
        self.F = c["intermediate_size"]
        self.L = c["num_hidden_layers"]
        self.H = c["num_attention_heads"]
        self.Hkv = c["num_key_value_heads"]
        self.D = c.get("head_dim") or self.d // self.H
        self.eps = c["rms_norm_eps"]
        self.theta = float(c["rope_theta"])
        self.W = c["sliding_window"]
        self.layer_types = c["layer_types"]
        self.rope_scaling = c.get("rope_scaling")
        self.max_pos = c["max_position_embeddings"]


# ---------------------------------------------------------------------------------------------- RoPE
def rope_default(cfg, dtype=torch.float64):
    """inv_freq_i = 1 / theta^(2i/D), i = 0..D/2-1 (computed in float64 here; HF rounds to fp32)."""
    i = torch.arange(0, cfg.D, 2, dtype=torch.float64)
    return (1.0 / cfg.theta ** (i / cfg.D)).to(dtype), 1.0, None


def rope_yarn(cfg, dtype=torch.float64):
    """HF _compute_yarn_parameters semantics (docs/reference/architecture.md A.4).  factor is recomputed as
    max_position_embeddings / original_max_position_embeddings when the latter is present (old HF
    behaviour); newer HF keeps the explicit factor.  Both agree for every config used here (checked)."""
    rs = cfg.rope_scaling
    D, theta = cfg.D, cfg.theta
    L0 = rs.get("original_max_position_embeddings")
    if L0 is not None:
        factor = cfg.max_pos / L0
        if abs(factor - rs["factor"]) > 1e-12:
            raise ValueError(f"rope_scaling.factor {rs['factor']} != max_pos/original {factor}")
    else:
        factor, L0 = rs["factor"], cfg.max_pos
    att = rs.get("attention_factor")
    if att is None:
        att = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
    beta_fast = rs.get("beta_fast") or 32
    beta_slow = rs.get("beta_slow") or 1

    def fcd(rot):
        return D * math.log(L0 / (rot * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(fcd(beta_fast)), 0)  # truncate=True (default)
    high = min(math.ceil(fcd(beta_slow)), D - 1)
    hi = high + 0.001 if high == low else high
    ramp = ((torch.arange(D // 2, dtype=torch.float64) - low) / (hi - low)).clamp(0, 1)
    base, _, _ = rope_default(cfg)
    inv = (base / factor) * ramp + base * (1 - ramp)
    info = dict(factor=factor, low=low, high=high, fcd_fast=fcd(beta_fast), fcd_slow=fcd(beta_slow),
                ramp=[float(r) for r in ramp], attention_factor=att)
    return inv.to(dtype), float(att), info


def rope_cos_sin(inv_freq, scale, pos, dtype):
    """pos [B,T] int -> cos, sin [B,T,D] (cat(freqs, freqs)), each multiplied by `scale`."""
    freqs = pos.to(torch.float64)[..., None] * inv_freq.to(torch.float64)[None, None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x, cos, sin):  # x [B,T,H,D], cos/sin [B,T,D]
    return x * cos[:, :, None, :] + rotate_half(x) * sin[:, :, None, :]


# --------------------------------------------------------------------------------------------- model
def init_params(cfg, seed=SEED_WEIGHTS):
    """Random float32 weights with HF tensor names.  Linear weights ~ N(0, 1/fan_in); embeddings N(0,1);
    every RMSNorm weight ~ 1 + 0.2*N(0,1) so that the norm gains matter."""
    g = mc.Init(seed)
    d, H, Hkv, D, F, V = cfg.d, cfg.H, cfg.Hkv, cfg.D, cfg.F, cfg.V
    P = {"model.embed_tokens.weight": g.normal((V, d), 1.0)}
    for i in range(cfg.L):
        p = f"model.layers.{i}."
        P[p + "self_attn.q_proj.weight"] = g.normal((H * D, d), d ** -0.5)
        P[p + "self_attn.k_proj.weight"] = g.normal((Hkv * D, d), d ** -0.5)
        P[p + "self_attn.v_proj.weight"] = g.normal((Hkv * D, d), d ** -0.5)
        P[p + "self_attn.o_proj.weight"] = g.normal((d, H * D), (H * D) ** -0.5)
        P[p + "self_attn.q_norm.weight"] = g.normal((H * D,), 0.2, 1.0)
        P[p + "self_attn.k_norm.weight"] = g.normal((Hkv * D,), 0.2, 1.0)
        P[p + "mlp.gate_proj.weight"] = g.normal((F, d), d ** -0.5)
        P[p + "mlp.up_proj.weight"] = g.normal((F, d), d ** -0.5)
        P[p + "mlp.down_proj.weight"] = g.normal((d, F), F ** -0.5)
        P[p + "post_attention_layernorm.weight"] = g.normal((d,), 0.2, 1.0)
        P[p + "post_feedforward_layernorm.weight"] = g.normal((d,), 0.2, 1.0)
    P["model.norm.weight"] = g.normal((d,), 0.2, 1.0)
    P["lm_head.weight"] = g.normal((V, d), d ** -0.5)
    return P


def forward(P, cfg, batch, yarn_all_layers=False, return_hidden=False):
    """Logits [B,T,V] in the dtype of P.  batch: input_ids, segment_ids, position_ids [B,T]."""
    ids = batch["input_ids"].long()
    seg, pos = batch["segment_ids"], batch["position_ids"]
    dt = P["lm_head.weight"].dtype
    B, T = ids.shape
    H, Hkv, D, eps = cfg.H, cfg.Hkv, cfg.D, cfg.eps
    G = H // Hkv

    inv_def, sc_def, _ = rope_default(cfg)
    rope = {"sliding_attention": rope_cos_sin(inv_def, sc_def, pos, dt)}
    if cfg.rope_scaling is not None and cfg.rope_scaling.get("rope_type") == "yarn":
        inv_y, sc_y, _ = rope_yarn(cfg)
        rope["full_attention"] = rope_cos_sin(inv_y, sc_y, pos, dt)
        if yarn_all_layers:  # the transformers regression: one YaRN rotary for every layer
            rope["sliding_attention"] = rope["full_attention"]
    else:
        rope["full_attention"] = rope["sliding_attention"]

    base_mask = mc.doc_mask(seg)  # [B,T,T]
    idx = torch.arange(T)
    window = (idx[:, None] - idx[None, :]) < cfg.W  # 0 <= i-j < W (i-j >= 0 from causal part)
    masks = {"full_attention": base_mask, "sliding_attention": base_mask & window[None]}

    h = P["model.embed_tokens.weight"][ids]  # no embedding scale, no embedding norm
    hidden = [h]
    for i in range(cfg.L):
        p = f"model.layers.{i}."
        lt = cfg.layer_types[i]
        x = h
        q = mc.rmsnorm(mc.linear(x, P[p + "self_attn.q_proj.weight"]), P[p + "self_attn.q_norm.weight"], eps)
        k = mc.rmsnorm(mc.linear(x, P[p + "self_attn.k_proj.weight"]), P[p + "self_attn.k_norm.weight"], eps)
        v = mc.linear(x, P[p + "self_attn.v_proj.weight"])
        q, k, v = q.view(B, T, H, D), k.view(B, T, Hkv, D), v.view(B, T, Hkv, D)
        cos, sin = rope[lt]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k = k.repeat_interleave(G, dim=2)  # q head h uses kv head h // G
        v = v.repeat_interleave(G, dim=2)
        s = torch.einsum("bihd,bjhd->bhij", q, k) * D ** -0.5
        s = s.masked_fill(~masks[lt][:, None], float("-inf"))
        a = torch.einsum("bhij,bjhd->bihd", torch.softmax(s, dim=-1), v).reshape(B, T, H * D)
        a = mc.linear(a, P[p + "self_attn.o_proj.weight"])
        h = h + mc.rmsnorm(a, P[p + "post_attention_layernorm.weight"], eps)
        m = mc.swiglu(h, P[p + "mlp.gate_proj.weight"], P[p + "mlp.up_proj.weight"], P[p + "mlp.down_proj.weight"])
        h = h + mc.rmsnorm(m, P[p + "post_feedforward_layernorm.weight"], eps)
        hidden.append(h)
    logits = mc.linear(mc.rmsnorm(h, P["model.norm.weight"], eps), P["lm_head.weight"])
    return (logits, hidden) if return_hidden else logits


def make_batch(cfg):
    init = mc.Init(SEED_BATCH)
    # Row 0: 3 documents (37, 58, 33); row 1: 2 documents (101, 27) -> positions up to 100 > 64 = original
    # context, documents longer than the window (16), boundaries at 37, 95 and 101.
    batch, docs = mc.pack_rows([[37, 58, 33], [101, 27]], 128, init, cfg.V, cfg.raw["eos_token_id"])
    targets, loss_mask = mc.make_targets(batch)
    batch["targets"], batch["loss_mask"] = targets, loss_mask
    return batch, docs


def run(P, cfg, batch, dtype, **kw):
    Pd = {k: v.detach().to(dtype).requires_grad_(True) for k, v in P.items()}
    logits, hidden = forward(Pd, cfg, batch, return_hidden=True, **kw)
    logits.retain_grad()
    loss = mc.lm_loss(logits, batch["targets"], batch["loss_mask"], Z_LOSS_COEF)
    loss["total"].backward()
    grads = {k: v.grad for k, v in Pd.items()}
    return logits, hidden, loss, grads


# ---------------------------------------------------------------------------------------- generation
def generate(out_dir):
    cfg = Cfg(TINY_CONFIG)
    P = init_params(cfg)
    n, nt = mc.count_params(P)
    assert (n, nt) == DOCUMENTED_COUNTS, (n, nt)
    batch, docs = make_batch(cfg)

    lg64, hid64, loss64, gr64 = run(P, cfg, batch, torch.float64)
    lg32, hid32, loss32, gr32 = run(P, cfg, batch, torch.float32)
    dlogits = lg64.grad

    with torch.no_grad():
        P64 = {k: v.double() for k, v in P.items()}
        lg_yall = forward(P64, cfg, batch, yarn_all_layers=True)
        lg_doc = torch.zeros_like(lg64)
        for (b, s, L) in docs:
            sub = {k: batch[k][b : b + 1, s : s + L] for k in ("input_ids", "segment_ids", "position_ids")}
            lg_doc[b, s : s + L] = forward(P64, cfg, sub)[0]
        # default RoPE everywhere (no YaRN at all) -- another regression a test may want to rule out
        cfg_norope = Cfg(dict(TINY_CONFIG, rope_scaling=None))
        lg_noyarn = forward(P64, cfg_norope, batch)

    packed_vs_doc = (lg_doc - lg64.detach()).abs().max().item()
    yall_diff = (lg_yall - lg64.detach()).abs().max().item()
    assert packed_vs_doc < 1e-10, packed_vs_doc
    assert yall_diff > 1e-3, yall_diff

    mc.ensure_dir(out_dir)
    mc.write_json(os.path.join(out_dir, "config.json"), TINY_CONFIG)
    mc.save_st(os.path.join(out_dir, "model.safetensors"), P, {"format": "pt"})
    mc.save_st(os.path.join(out_dir, "model_bf16.safetensors"),
               {k: v.to(torch.bfloat16) for k, v in P.items()}, {"format": "pt"})
    mc.save_st(os.path.join(out_dir, "batch.safetensors"), {
        "input_ids": batch["input_ids"], "segment_ids": batch["segment_ids"],
        "position_ids": batch["position_ids"], "label_mask": batch["label_mask"],
        "targets": batch["targets"], "loss_mask": batch["loss_mask"]})
    mc.save_st(os.path.join(out_dir, "outputs.safetensors"), {
        "logits": mc.f32(lg64),
        "logprobs": mc.f32(loss64["logprob"]),
        "lse": mc.f32(loss64["lse"]),
        "dlogits": mc.f32(dlogits),
        "hidden_states": mc.f32(torch.stack(hid64)),
        "logits_yarn_all_layers": mc.f32(lg_yall),
        "logits_per_document": mc.f32(lg_doc),
    })
    mc.save_st(os.path.join(out_dir, "grads.safetensors"), {k: mc.f32(v) for k, v in gr64.items()})

    grad_disc = {k: mc.discrepancy(gr64[k], gr32[k]) for k in sorted(P)}
    worst = max(v["max_abs_over_max_ref"] for v in grad_disc.values())
    _, _, yinfo = rope_yarn(cfg)
    inv_def, _, _ = rope_default(cfg)
    inv_y, _, _ = rope_yarn(cfg)
    expected = {
        "model": "olmo3 (D.1 tiny)",
        "generator": "tests/reference/model_olmo3.py",
        "torch_version": torch.__version__,
        "seeds": {"weights": SEED_WEIGHTS, "batch": SEED_BATCH},
        "param_count": n, "tensor_count": nt,
        "batch": {"B": 2, "T": 128, "documents": [{"row": b, "start": s, "length": L} for b, s, L in docs],
                  "n_trained_targets": loss64["n_trained"]},
        "loss": {
            "z_loss_coef": Z_LOSS_COEF,
            "total": loss64["total"].item(), "ce": loss64["ce"].item(),
            "z_loss": loss64["z"].item(), "z_loss_unscaled_mean_lse2": loss64["z_raw"].item(),
        },
        "rope": {
            "default_inv_freq": [float(x) for x in inv_def],
            "yarn_inv_freq": [float(x) for x in inv_y],
            "yarn": yinfo,
        },
        "checks": {
            "packed_vs_per_document_max_abs_logit_diff_f64": mc.sig3(packed_vs_doc),
            "yarn_all_layers_vs_correct_max_abs_logit_diff": mc.sig3(yall_diff),
            "no_yarn_vs_correct_max_abs_logit_diff": mc.sig3((lg_noyarn - lg64.detach()).abs().max().item()),
        },
        "f32_vs_f64": {
            "note": "the same forward/backward run entirely in float32 vs float64 (the stored truth)",
            "logits": mc.discrepancy(lg64.detach(), lg32.detach()),
            "hidden_states": mc.discrepancy(torch.stack(hid64).detach(), torch.stack(hid32).detach()),
            "loss_total_abs": mc.sig3(abs(loss64["total"].item() - loss32["total"].item())),
            "ce_abs": mc.sig3(abs(loss64["ce"].item() - loss32["ce"].item())),
            "z_loss_abs": mc.sig3(abs(loss64["z"].item() - loss32["z"].item())),
            "dlogits": mc.discrepancy(dlogits, lg32.grad),
            "grads_worst_max_abs_over_max_ref": worst,
            "grads": grad_disc,
        },
    }
    mc.write_json(os.path.join(out_dir, "expected.json"), expected)
    print(f"olmo3_tiny: params {n} ({nt} tensors), loss {loss64['total'].item():.6f} "
          f"(ce {loss64['ce'].item():.6f}, z {loss64['z'].item():.3e}), trained {loss64['n_trained']}")
    print(f"  f32 vs f64: logits {expected['f32_vs_f64']['logits']}, worst grad rel {worst}")
    print(f"  packed vs per-doc {packed_vs_doc:.2e}, yarn-all diff {yall_diff:.3f}")


# ------------------------------------------------------------------------------------------- checks
def check():
    cfg = Cfg(TINY_CONFIG)
    P = init_params(cfg)
    n, nt = mc.count_params(P)
    print(f"param count {n} ({nt} tensors); documented {DOCUMENTED_COUNTS[0]} ({DOCUMENTED_COUNTS[1]})")
    assert (n, nt) == DOCUMENTED_COUNTS

    # YaRN numbers quoted in docs/reference/architecture.md A.4 (7B: D=128, L0=8192) and D.1 (tiny: low/high 0/2)
    c7 = Cfg(dict(TINY_CONFIG, hidden_size=4096, num_attention_heads=32, max_position_embeddings=65536,
                  rope_scaling=dict(TINY_CONFIG["rope_scaling"], original_max_position_embeddings=8192)))
    inv7, _, info7 = rope_yarn(c7)
    assert (info7["low"], info7["high"]) == (18, 35), info7
    for i, want in ((19, 1.9282754938e-02), (26, 2.8467184387e-03), (34, 1.6561303595e-04), (63, 3.0689259889e-07)):
        assert abs(inv7[i].item() / want - 1) < 1e-9, (i, inv7[i].item(), want)
    _, _, infot = rope_yarn(cfg)
    assert (infot["low"], infot["high"]) == (0, 2) and infot["ramp"][:3] == [0.0, 0.5, 1.0], infot
    print(f"yarn: 7B low/high 18/35 and sample inv_freq match A.4; tiny low/high 0/2 ramp {infot['ramp']}")

    # gradcheck (fp64, finite differences) on a short packed batch and a subset of parameters
    small = Cfg(dict(TINY_CONFIG, sliding_window=4))
    init = mc.Init(3)
    batch, _ = mc.pack_rows([[9, 3, 8]], 20, init, cfg.V, 1)
    batch["targets"], batch["loss_mask"] = mc.make_targets(batch)
    P64 = {k: v.double() for k, v in P.items()}
    ids = sorted(set(batch["input_ids"].flatten().tolist()))
    subsets = [  # (name, index) -- index selects the checked slice
        ("model.layers.3.self_attn.q_norm.weight", slice(0, 24)),
        ("model.layers.3.self_attn.k_norm.weight", slice(0, 32)),
        ("model.layers.0.self_attn.q_proj.weight", (slice(0, 2), slice(None))),
        ("model.layers.1.self_attn.k_proj.weight", (slice(16, 17), slice(None))),
        ("model.layers.7.self_attn.v_proj.weight", (slice(0, 1), slice(None))),
        ("model.layers.2.self_attn.o_proj.weight", (slice(5, 6), slice(None))),
        ("model.layers.4.mlp.gate_proj.weight", (slice(0, 1), slice(None))),
        ("model.layers.4.mlp.up_proj.weight", (slice(3, 4), slice(None))),
        ("model.layers.6.mlp.down_proj.weight", (slice(0, 1), slice(None))),
        ("model.layers.5.post_attention_layernorm.weight", slice(None)),
        ("model.layers.0.post_feedforward_layernorm.weight", slice(None)),
        ("model.norm.weight", slice(None)),
        ("model.embed_tokens.weight", (ids[:2], slice(None))),
        ("lm_head.weight", (ids[:1], slice(None))),
    ]
    for yall in (False, True):
        for name, ix in (subsets if not yall else subsets[:3]):
            base = P64[name]

            def f(sub, name=name, ix=ix, base=base):
                Q = dict(P64)
                w = base.clone()
                w[ix] = sub
                Q[name] = w
                lg = forward(Q, small, batch, yarn_all_layers=yall)
                return mc.lm_loss(lg, batch["targets"], batch["loss_mask"], 0.1)["total"]

            x = base[ix].clone().requires_grad_(True)
            ok = torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-7, rtol=1e-5)
            assert ok
        print(f"gradcheck ok ({'yarn on all layers' if yall else 'per-layer-type RoPE'}): "
              f"{3 if yall else len(subsets)} parameter slices, window 4, packed docs [9,3,8], z-loss coef 0.1")

    # packed == per-document, and the sliding window really masks (window 4 vs 128 differ)
    with torch.no_grad():
        full = forward(P64, small, batch)
        for s, L in ((0, 9), (9, 3), (12, 8)):
            sub = {k: batch[k][:, s : s + L] for k in ("input_ids", "segment_ids", "position_ids")}
            assert (forward(P64, small, sub) - full[:, s : s + L]).abs().max() < 1e-10
        wide = forward(P64, Cfg(dict(TINY_CONFIG, sliding_window=128)), batch)
        assert (wide - full).abs().max() > 1e-3
    print("packed == per-document (fp64, < 1e-10); window 4 != window 128")
    print("model_olmo3 --check: all passed")


# ------------------------------------------------------------------------------------------- bench
# D.1 small (docs/reference/architecture.md D.1): vocab 4096, hidden 256, 8 layers (3:1), heads 8, kv 4, head_dim 32,
# intermediate 704, window 64, max_pos 2048, yarn factor 8 with original 256.
SMALL_CONFIG = dict(TINY_CONFIG, vocab_size=4096, hidden_size=256, intermediate_size=704, num_attention_heads=8,
                    num_key_value_heads=4, sliding_window=64, max_position_embeddings=2048,
                    rope_scaling=dict(TINY_CONFIG["rope_scaling"], original_max_position_embeddings=256))


def bench(T, docs, iters, threads):
    import json
    import time
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(False)
    cfg = Cfg(SMALL_CONFIG)
    P = {k: v.requires_grad_(True) for k, v in init_params(cfg, seed=1).items()}
    lens = [T // docs] * docs
    lens[-1] += T - sum(lens)
    batch, _ = mc.pack_rows([lens], T, mc.Init(2), cfg.V, cfg.raw["eos_token_id"])
    targets, _ = mc.make_targets(batch)
    trained = (targets >= 0).to(torch.uint8)  # every next token within a document

    def step():
        for p in P.values():
            p.grad = None
        lg = forward(P, cfg, batch)
        loss = mc.lm_loss(lg, targets, trained, Z_LOSS_COEF)["total"]
        loss.backward()

    step()  # warm-up
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(iters):
        step()
    wall, cpu = (time.perf_counter() - w0) / iters, (time.process_time() - c0) / iters
    print(json.dumps({"impl": "pytorch-reference", "torch": torch.__version__, "threads": threads, "T": T,
                      "docs": docs, "iters": iters, "sec_per_step": wall, "cpu_sec_per_step": cpu,
                      "tokens_per_s": T / wall}))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--docs", type=int, default=4)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if a.bench:
        bench(a.T, a.docs, a.iters, a.threads)
    elif a.check:
        check()
    else:
        generate(a.out)
