"""Upstream oracle for Olmo Hybrid (HF `olmo_hybrid`: Gated DeltaNet + attention): transformers' own
OlmoHybridForCausalLM (pinned in deps/pypi/reference.txt; fla and causal_conv1d are hidden from import, so its torch
fallback GDN kernels and conv run), run from the reference environment:

  deps/venv-reference/bin/python tests/reference/hf_olmo_hybrid.py
  deps/venv-reference/bin/python tests/reference/hf_olmo_hybrid.py --check-export DIR --case CASE

Writes tests/golden/model/hf_olmo_hybrid/<case>/ for the cases rope_negeig (RoPE theta 10000, allow_neg_eigval),
nope_poseig (NoPE: rope_theta null; beta in (0,1)) and gva (as rope_negeig with 4 value heads on 2 key heads):
- config.json, generation_config.json, model.safetensors: a tiny random model (seeded, float32) as transformers'
  `save_pretrained` writes it, i.e. with ITS renames (attention_layer_norm / feedforward_layer_norm, the fused conv
  split into three equal chunks q/k/v_conv1d: an upstream bug an importer must undo);
- oracle.safetensors: a packed batch B=2, T=80 (row 0: one document of 80 tokens, crossing the GDN chunk of 64;
  row 1: documents of 37 and 43), each document run ALONE (upstream has no packing), per-token log-probs / lse in
  float64 and float32, the mean CE, and its float64 autograd gradient for every parameter (module names);
- oracle.json: versions, seeds, config, documents, tensor names written on disk, measured gaps.
The float64 run is transformers' own code with its float32 casts kept float64 (keep_float64 below), checked
against a float64 re-implementation of the GDN layer and by chunked-vs-recurrent at model level.

--check-export DIR --case CASE loads DIR (e.g. our HF export: module names, fused conv) with from_pretrained,
requires no missing/unexpected tensors and the case's per-token log-probs within 1e-5 of `logprobs_f32`.

Deterministic (one thread, fixed seeds, eager attention): a rerun writes the same bytes. See docs/model_reference.md
("Upstream oracle: transformers OlmoHybridForCausalLM").
"""
import argparse
import contextlib
import copy
import json
import math
import os
import shutil
import sys

# The oracle is transformers' torch path. When fla (flash-linear-attention) or causal_conv1d is importable,
# transformers routes the GDN kernels and the conv to them (Triton/CUDA): hide them before transformers is imported.
for _pkg in ("fla", "causal_conv1d"):
    sys.modules[_pkg] = None

import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import OlmoHybridConfig, OlmoHybridForCausalLM
from transformers.models.olmo_hybrid import modeling_olmo_hybrid as mh

PINNED_TRANSFORMERS = "5.23.0"
PINNED_TORCH = "2.15.0"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden", "model", "hf_olmo_hybrid")
CASES = {"rope_negeig": dict(rope_theta=10000.0, neg=True, hv=2),
         "nope_poseig": dict(rope_theta=None, neg=False, hv=2),
         "gva": dict(rope_theta=10000.0, neg=True, hv=4)}
SEED_WEIGHTS = 20260530
SEED_TOKENS = 31
PAD, EOS = 0, 1
B, T = 2, 80
DOCS = [(0, 0, 80), (1, 0, 37), (1, 37, 43)]  # (row, start, length)
NOTE_F64 = ("float64 run: model.double() (float32 weights rounded once from float64 draws), the rotary inv_freq "
            "recomputed in float64 (transformers computes it in float32), and inside keep_float64() every cast of a "
            "float64 tensor to float32 stays float64: Tensor.to(torch.float32) (RMSNorm, gated o_norm, the GDN "
            "kernels' inputs), Tensor.float() (A_log, a_proj(x), rotary inv_freq), softmax(dtype=torch.float32) "
            "(eager attention). Checked: GDN layers vs a float64 re-implementation of the equations; chunked vs "
            "recurrent GDN at model level ~1e-14 (any float32 rounding would show as ~1e-7).")


def torch_path(fn):
    """The implementation a transformers hub-kernel wrapper resolved to at import time."""
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    return cells["implementation"].cell_contents if "implementation" in cells else fn


def die(msg):
    print("hf_olmo_hybrid.py: FAILED: " + msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        die(msg)


def sig3(x):
    return float(f"{x:.3g}")


def gap(a, b):
    """max |a-b| and that over max |b| (b = reference), 3 significant digits."""
    d = (a.double() - b.double()).abs().max().item()
    return {"max_abs": sig3(d), "max_abs_over_max_ref": sig3(d / max(b.double().abs().max().item(), 1e-300))}


@contextlib.contextmanager
def swapped(*triples):
    old = [(o, n, getattr(o, n)) for o, n, _ in triples]
    for o, n, v in triples:
        setattr(o, n, v)
    try:
        yield
    finally:
        for o, n, v in old:
            setattr(o, n, v)


def keep_float64():
    """Within the block, casting a float64 tensor to float32 keeps it float64 (see NOTE_F64)."""
    to, flt, softmax = torch.Tensor.to, torch.Tensor.float, F.softmax

    def to64(t, *a, **k):
        if t.dtype == torch.float64:
            a = tuple(torch.float64 if x is torch.float32 else x for x in a)
            if k.get("dtype") is torch.float32:
                k["dtype"] = torch.float64
        return to(t, *a, **k)

    def float64(t, *a, **k):
        return t if t.dtype == torch.float64 else flt(t, *a, **k)

    def softmax64(x, *a, dtype=None, **k):
        return softmax(x, *a, dtype=torch.float64 if x.dtype == torch.float64 and dtype is torch.float32 else dtype,
                       **k)
    return swapped((torch.Tensor, "to", to64), (torch.Tensor, "float", float64), (F, "softmax", softmax64))


# ------------------------------------------------------------------------------------------- model and batch
def tiny_config(rope_theta, neg, hv):
    cfg = OlmoHybridConfig(
        vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, layer_types=["linear_attention"] * 3 + ["full_attention"], linear_num_key_heads=2,
        linear_num_value_heads=hv, linear_key_head_dim=8, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        linear_allow_neg_eigval=neg, max_position_embeddings=256, rms_norm_eps=1e-6, hidden_act="silu",
        rope_parameters={"rope_theta": rope_theta}, tie_word_embeddings=False, pad_token_id=PAD,
        bos_token_id=None, eos_token_id=EOS)
    cfg._attn_implementation = "eager"
    return cfg


def init_weights(model, seed):
    """Drawn in float64 from one seeded generator in named_parameters order, rounded once to float32: norm gains
    (o_norm, q/k_norm included) 1 + 0.2 N(0,1); embedding N(0,1); conv N(0,1/K); A_log = ln U[1,16]; dt_bias =
    HF's inverse-softplus of dt = exp(U[ln 1e-3, ln 0.1]); every Linear N(0, 1/fan_in)."""
    g = torch.Generator().manual_seed(seed)

    def randn(shape):
        return torch.randn(shape, generator=g, dtype=torch.float64)

    def rand(shape):
        return torch.rand(shape, generator=g, dtype=torch.float64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                v = 1.0 + 0.2 * randn(p.shape)
            elif "embed_tokens" in name:
                v = randn(p.shape)
            elif name.endswith("conv1d.weight"):
                v = randn(p.shape) / math.sqrt(p.shape[-1])
            elif name.endswith("A_log"):
                v = (1.0 + 15.0 * rand(p.shape)).log()
            elif name.endswith("dt_bias"):
                dt = (rand(p.shape) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).exp().clamp(min=1e-4)
                v = dt + torch.log(-torch.expm1(-dt))
            else:
                v = randn(p.shape) / math.sqrt(p.shape[1])
            p.copy_(v.to(p.dtype))


def as_float64(model):
    m = copy.deepcopy(model).double()
    rot = m.model.rotary_emb
    if rot is not None:
        theta, dim = m.config.rope_parameters["rope_theta"], rot.inv_freq.numel() * 2
        inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        rot.inv_freq, rot.original_inv_freq = inv, inv.clone()
    return m


def make_batch():
    """Random tokens in [2, 256) with each document's last token EOS; segments 1-based per row; positions and
    next-token targets per document (-100 at a document's last token)."""
    g = torch.Generator().manual_seed(SEED_TOKENS)
    ids = torch.randint(2, 256, (B, T), generator=g, dtype=torch.int64)
    seg, pos, tgt = (torch.zeros(B, T, dtype=torch.int64) for _ in range(3))
    for b, s, n in DOCS:
        ids[b, s + n - 1] = EOS
        seg[b, s:s + n] = 1 + sum(1 for bb, ss, _ in DOCS if bb == b and ss < s)
        pos[b, s:s + n] = torch.arange(n)
        tgt[b, s:s + n - 1] = ids[b, s + 1:s + n]
        tgt[b, s + n - 1] = -100
    return {"input_ids": ids, "segment_ids": seg, "position_ids": pos, "targets": tgt}


def run_docs(model, batch, grads):
    """Each document alone (batch of 1, no padding): per-token log p(target), lse, mean CE over all targets; with
    grads, the gradient of that mean CE for every parameter (module names)."""
    dtype = model.lm_head.weight.dtype
    lp, lse = torch.zeros(B, T, dtype=dtype), torch.zeros(B, T, dtype=dtype)
    n_tgt = int((batch["targets"] != -100).sum())
    model.zero_grad(set_to_none=True)
    for b, s, n in DOCS:
        logits = model(batch["input_ids"][b:b + 1, s:s + n], use_cache=False).logits[0]
        tg = batch["targets"][b, s:s + n]
        m = tg != -100
        lpd = logits.log_softmax(-1)[torch.arange(n)[m], tg[m]]
        if grads:
            (-lpd.sum() / n_tgt).backward()
        lp[b, s:s + n][m] = lpd.detach()
        lse[b, s:s + n] = logits.detach().logsumexp(-1)
    out = {"lp": lp, "lse": lse, "ce": -lp.sum() / n_tgt}
    if grads:
        out["grads"] = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
    return out


# ------------------------------------------------------------------------------------------- oracle checks
def gdn_reference(la, x):
    """Float64 GDN layer from the equations (olmo_hybrid.md section 3), recurrent form; x [T, d] normed input."""
    t_len, hk, hv, dk, dv = x.shape[0], la.num_k_heads, la.num_v_heads, la.head_k_dim, la.head_v_dim
    c = torch.cat([x @ la.q_proj.weight.T, x @ la.k_proj.weight.T, x @ la.v_proj.weight.T], -1)
    w, kk = la.conv1d.weight[:, 0, :], la.conv_kernel_size
    cp = F.pad(c, (0, 0, kk - 1, 0))
    c = F.silu(sum(w[:, j] * cp[j:j + t_len] for j in range(kk)))
    q, k, v = c.split([hk * dk, hk * dk, hv * dv], -1)

    def unit(u):
        u = u.view(t_len, hk, dk)
        return (u / (u.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()).repeat_interleave(hv // hk, dim=1)
    q, k, v = unit(q) * dk ** -0.5, unit(k), v.view(t_len, hv, dv)
    beta = torch.sigmoid(x @ la.b_proj.weight.T) * (2.0 if la.allow_neg_eigval else 1.0)
    g = -la.A_log.exp() * F.softplus(x @ la.a_proj.weight.T + la.dt_bias)
    s, o = torch.zeros(hv, dk, dv, dtype=x.dtype), torch.zeros(t_len, hv, dv, dtype=x.dtype)
    for t in range(t_len):
        s = g[t].exp()[:, None, None] * s
        u = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", s, k[t]))
        s = s + k[t][:, :, None] * u[:, None, :]
        o[t] = torch.einsum("hkv,hk->hv", s, q[t])
    z = (x @ la.g_proj.weight.T).view(t_len, hv, dv)
    y = o * (o.pow(2).mean(-1, keepdim=True) + 1e-5).rsqrt() * la.o_norm.weight * F.silu(z)
    return y.reshape(t_len, hv * dv) @ la.o_proj.weight.T


def record_calls(model, ids):
    """Runs ids [1, n]; returns the GDN layers' (module input, module output) and layer 0's kernel call."""
    io, kernel = [], []
    hooks = [layer.linear_attn.register_forward_hook(
        lambda mod, a, k, out: io.append((k["hidden_states"][0].detach(), out[0].detach())), with_kwargs=True)
        for layer in model.model.layers if hasattr(layer, "linear_attn")]
    chunk = mh.torch_chunk_gated_delta_rule

    def recorder(*a, **k):
        if not kernel:
            kernel.append((a, k))
        return chunk(*a, **k)
    with torch.no_grad(), swapped((mh, "torch_chunk_gated_delta_rule", recorder)):
        model(ids, use_cache=False)
    for h in hooks:
        h.remove()
    return io, kernel[0]


def oracle_crosschecks(m32, m64, batch):
    """Upstream chunked vs recurrent kernel on layer 0's real inputs (row 0, T = 80) and at model level; the
    float64 model's GDN layers vs gdn_reference."""
    ids = batch["input_ids"][:1]
    res = {"kernel_chunk_vs_recurrent_layer0_row0": {}, "model_logprobs_chunk_vs_recurrent_max_abs": {}}

    def recurrent_instead(*a, chunk_size=64, **k):
        return mh.torch_recurrent_gated_delta_rule(*a, **k)
    for name, m, ctx in (("fp32", m32, contextlib.nullcontext), ("fp64", m64, keep_float64)):
        with ctx():
            io, (a, k) = record_calls(m, ids)
            with torch.no_grad():
                oc, orec = mh.torch_chunk_gated_delta_rule(*a, **k)[0], mh.torch_recurrent_gated_delta_rule(*a, **k)[0]
                check(oc.dtype == (torch.float64 if name == "fp64" else torch.float32), f"{name}: kernel dtype")
                res["kernel_chunk_vs_recurrent_layer0_row0"][name] = gap(oc, orec)
                lp = run_docs(m, batch, grads=False)["lp"]
                with swapped((mh, "torch_chunk_gated_delta_rule", recurrent_instead)):
                    lp_rec = run_docs(m, batch, grads=False)["lp"]
            res["model_logprobs_chunk_vs_recurrent_max_abs"][name] = sig3((lp - lp_rec).abs().max().item())
        if name == "fp64":
            layers = [layer.linear_attn for layer in m.model.layers if hasattr(layer, "linear_attn")]
            with torch.no_grad():
                d = max(gap(y, gdn_reference(la, x))["max_abs_over_max_ref"] for la, (x, y) in zip(layers, io))
            res["gdn_layers_f64_vs_own_f64_reimplementation_max_abs_over_max_ref"] = d
    print("cross-checks:", json.dumps(res))
    check(res["gdn_layers_f64_vs_own_f64_reimplementation_max_abs_over_max_ref"] < 1e-12,
          "the float64 GDN layers differ from the float64 re-implementation (a float32 cast left, or a wrong reading)")
    check(res["kernel_chunk_vs_recurrent_layer0_row0"]["fp64"]["max_abs_over_max_ref"] < 1e-12, "fp64 kernels")
    check(res["model_logprobs_chunk_vs_recurrent_max_abs"]["fp64"] < 1e-11, "fp64 model: chunked vs recurrent")
    check(res["kernel_chunk_vs_recurrent_layer0_row0"]["fp32"]["max_abs_over_max_ref"] < 1e-4, "fp32 kernels")
    return res


def packed_check(m32, batch, alone_lp):
    """Row 1 packed as ONE sequence (positions restarting, no mask): transformers masks attention by the positions
    but the GDN state and conv leak, so document 2 changes: the per-document run is the right reference."""
    with torch.no_grad():
        lg = m32(batch["input_ids"][1:], position_ids=batch["position_ids"][1:], use_cache=False).logits[0]
    tg = batch["targets"][1]
    m = tg != -100
    lp = torch.zeros(T)
    lp[m] = lg.log_softmax(-1)[torch.arange(T)[m], tg[m]]
    d1, d2 = ((lp[s:s + n] - alone_lp[1, s:s + n]).abs().max().item() for b, s, n in DOCS[1:])
    print(f"packed row 1 vs each document alone: doc 1 {d1:.3g}, doc 2 {d2:.3g}")
    check(d1 < 1e-5, f"packed row: document 1 changed by {d1}")
    check(d2 > 1e-3, f"packed row: document 2 changed by only {d2}: no leak upstream any more?")
    return {"doc1_max_abs": sig3(d1), "doc2_max_abs": sig3(d2)}


# ------------------------------------------------------------------------------------------- writing a case
def disk_tensors(path):
    with safe_open(path, "pt") as f:
        return {k: [f.get_slice(k).get_dtype()] + list(f.get_slice(k).get_shape()) for k in sorted(f.keys())}


def save_and_reload(model, out, batch):
    if os.path.isdir(out):
        shutil.rmtree(out)
    model.save_pretrained(out)
    re, info = OlmoHybridForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager",
                                                     output_loading_info=True)
    check(not info["missing_keys"] and not info["unexpected_keys"], f"reload of {out}: {info}")
    with torch.no_grad():
        for b, s, n in DOCS:
            ids = batch["input_ids"][b:b + 1, s:s + n]
            check(torch.equal(re(ids, use_cache=False).logits, model(ids, use_cache=False).logits),
                  f"{out}: from_pretrained of the saved directory changes the logits")
    return disk_tensors(os.path.join(out, "model.safetensors"))


def write_case(case, spec):
    torch.manual_seed(0)
    m32 = OlmoHybridForCausalLM(tiny_config(spec["rope_theta"], spec["neg"], spec["hv"])).eval()
    init_weights(m32, SEED_WEIGHTS)
    m64 = as_float64(m32)
    batch = make_batch()
    r32 = run_docs(m32, batch, grads=True)
    with keep_float64():
        r64 = run_docs(m64, batch, grads=True)
    check(r64["lp"].dtype == torch.float64 and all(g.dtype == torch.float64 for g in r64["grads"].values()),
          "float64 run is not float64")
    check(all(g.abs().max() > 0 for g in r64["grads"].values()), "a parameter gets no gradient")
    out = os.path.join(OUT, case)
    on_disk = save_and_reload(m32, out, batch)
    cross = oracle_crosschecks(m32, m64, batch)
    packed = packed_check(m32, batch, r32["lp"])
    tensors = {k: v.to(torch.int32).contiguous() for k, v in batch.items()}
    tensors.update(logprobs=r64["lp"], logprobs_f32=r32["lp"], lse=r64["lse"], ce=r64["ce"].reshape(1))
    tensors.update({"grad." + k: g.float().contiguous() for k, g in r64["grads"].items()})
    save_file(tensors, os.path.join(out, "oracle.safetensors"), metadata={"format": "pt"})
    grad_gaps = {k: gap(r32["grads"][k], g)["max_abs_over_max_ref"] for k, g in r64["grads"].items()}
    gaps = {"logprobs_f32_vs_f64_max_abs": sig3((r32["lp"].double() - r64["lp"]).abs().max().item()),
            "lse_f32_vs_f64_max_abs": sig3((r32["lse"].double() - r64["lse"]).abs().max().item()),
            "ce_f32_vs_f64_abs": sig3(abs(r32["ce"].item() - r64["ce"].item())),
            "grads_f32_vs_f64_max_abs_over_max_ref_max": max(grad_gaps.values()),
            "grads_f32_vs_f64_max_abs_over_max_ref": grad_gaps, "oracle_crosscheck": cross,
            "packed_row1_as_one_sequence_vs_alone_logprobs": packed}
    print(case, "ce", r64["ce"].item(), json.dumps({k: v for k, v in gaps.items() if "grads_f32" not in k
                                                     or k.endswith("_max")}))
    meta = {"source": "tests/reference/hf_olmo_hybrid.py (transformers OlmoHybridForCausalLM, save_pretrained)",
            "transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
            "attn_implementation": "eager", "gdn_kernels": "transformers' torch fallbacks (fla, causal_conv1d hidden from import)",
            "weights_seed": SEED_WEIGHTS, "tokens_seed": SEED_TOKENS, "batch": [B, T],
            "documents_row_start_length": DOCS, "pad_token_id": PAD, "eos_token_id": EOS,
            "n_targets": int((batch["targets"] != -100).sum()), "ce_f64": r64["ce"].item(),
            "config": json.load(open(os.path.join(out, "config.json"))),
            "note": "Each document is run alone (batch of 1, no padding, positions from 0, use_cache=False); "
                    "logprobs[b,t] = log p(targets[b,t] | its document up to t), 0 where targets = -100; lse at "
                    "every position; ce = mean of -logprobs over the targets; grad.<module name> = d ce / d param "
                    "(float64 autograd, stored float32; conv1d fused [C,1,K]). " + NOTE_F64,
            "disk_tensors_dtype_shape": on_disk, "gaps": gaps}
    with open(os.path.join(out, "oracle.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


# ------------------------------------------------------------------------------------------- export check
def check_export(path, case):
    fix = load_file(os.path.join(OUT, case, "oracle.safetensors"))
    batch = {k: fix[k].long() for k in ("input_ids", "segment_ids", "position_ids", "targets")}
    model, info = OlmoHybridForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager",
                                                        output_loading_info=True)
    model.eval()
    print(f"{path}: missing {info['missing_keys']}, unexpected {info['unexpected_keys']}, "
          f"mismatched {info['mismatched_keys']}")
    with torch.no_grad():
        lp = run_docs(model, batch, grads=False)["lp"]
    d = (lp.double() - fix["logprobs_f32"].double()).abs().max().item()
    print(f"{path} vs {case}: per-token log-probs max |diff| {d:.3g} (vs float64: "
          f"{(lp.double() - fix['logprobs']).abs().max().item():.3g})")
    check(not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"],
          "transformers did not load every tensor of the export")
    check(d <= 1e-5, f"log-probs differ by {d} > 1e-5")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check-export", metavar="DIR", help="HF directory to check against a case's fixture")
    ap.add_argument("--case", choices=sorted(CASES), help="the case --check-export compares with")
    a = ap.parse_args()
    check(transformers.__version__ == PINNED_TRANSFORMERS,
          f"transformers {transformers.__version__}, pinned {PINNED_TRANSFORMERS} (deps/pypi/reference.txt)")
    check(torch.__version__.split("+")[0] == PINNED_TORCH, f"torch {torch.__version__}, pinned {PINNED_TORCH}")
    for f in (mh.torch_chunk_gated_delta_rule, mh.torch_recurrent_gated_delta_rule, mh.causal_conv1d_fn):
        check(torch_path(f).__module__ == mh.__name__, f"{f.__name__} resolves to {torch_path(f).__module__}")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if a.check_export:
        check(a.case is not None, "--check-export needs --case")
        check_export(a.check_export, a.case)
        return
    for case, spec in CASES.items():
        write_case(case, spec)


if __name__ == "__main__":
    main()
