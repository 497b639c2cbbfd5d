#!/usr/bin/python3
"""PyTorch peer of bench/train.cpp: the same training step (forward + backward + clip_grad_norm_ + AdamW) on
the same config, the same initial weights and the same packed batch, written in plain PyTorch (float32).

  /usr/bin/python3 bench/train_torch.py --dir DIR --steps S --threads N
      DIR holds what bench_train wrote: config.json, weights.safetensors (our initial fp32 weights, HF names),
      batch.safetensors (tokens/segments/positions/targets/trained [ga*B, T] and meta). Runs one warm-up step
      plus S timed steps on the same global batch and prints one JSON line (tokens/s, CPU s, per-step losses,
      peak RSS).
      --dtype bf16: the same step under torch.autocast("cpu", dtype=torch.bfloat16) (the forward; the
      backward follows its dtypes): PyTorch's CPU bf16 compute, the peer of our compute.dtype=bf16 (bf16 GEMM
      operands, fp32 masters and optimizer state).
  /usr/bin/python3 bench/train_torch.py --check
      float64 check that the faster hybrid pieces used here (chunked KDA per document, sparse expert dispatch)
      give the same loss and gradients as tests/reference/model_olmo3moe.py's recurrent/dense forward.

The models are the independent references in tests/reference (model_olmo3.py, model_olmo3moe.py), run
unchanged except:
  - the LM head is applied only to the trained positions (as our tiled cross-entropy does; the reference's
    forward is called with a 1-row dummy head and the final norm + head + CE are done here);
  - hybrid: KDA uses the reference's chunked (WY) form per document instead of the per-token Python loop,
    and each routed expert runs only on its tokens (index_select / index_add) instead of on every token.
    Both are checked against the reference with --check.
Loss = (sum CE + lm_z * sum lse^2) / trained targets of the whole step + (moe_lb * LB + router_z * Z) / ga
per micro-batch, the trainer's convention; clip 1.0 before AdamW(betas 0.9/0.95, eps 1e-8, wd 0).
"""
import argparse
import json
import os
import resource
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))
import model_common as mc  # noqa: E402  (sets deterministic algorithms and 1 thread; overridden below)
import model_olmo3 as o3  # noqa: E402
import model_olmo3moe as om  # noqa: E402
import model_safetensors as st  # noqa: E402


def vm_kb(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return -1


def reset_hwm():
    """Reset VmHWM (peak RSS) to the current RSS (Linux >= 4.0); returns False where not permitted."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# ------------------------------------------------------------------------------- faster hybrid pieces
def doc_runs(seg_row):
    """[(start, end)] of maximal runs of equal segment id in one row."""
    s = seg_row.tolist()
    runs, a = [], 0
    for t in range(1, len(s) + 1):
        if t == len(s) or s[t] != s[a]:
            runs.append((a, t))
            a = t
    return runs


def kda_chunked_docs(q, k, v, g, beta, seg, scale, C=64):
    """The reference's chunked KDA (architecture.md C.3) applied to each document of each row separately
    (state reset at document starts, as kda_recurrent does). Padding runs are treated as one document."""
    rows = []
    for b in range(q.shape[0]):
        parts = [om.kda_chunked(q[b:b + 1, s:e], k[b:b + 1, s:e], v[b:b + 1, s:e], g[b:b + 1, s:e],
                                beta[b:b + 1, s:e], scale, C) for s, e in doc_runs(seg[b])]
        rows.append(torch.cat(parts, dim=1))
    return torch.cat(rows, dim=0)


def moe_layer_sparse(P, m, cfg, x):
    """model_olmo3moe.moe_layer with each routed expert applied only to the tokens routed to it."""
    B, T, d = x.shape
    N = B * T
    xf = x.reshape(N, d)
    rl = mc.linear(xf, P[m + "router.gate.weight"])
    p = torch.softmax(rl, dim=-1)
    topv, topi = torch.topk(p, cfg.k, dim=-1)
    w = topv / topv.sum(-1, keepdim=True) * cfg.k
    z = mc.linear(xf, P[m + "latent_down_proj.weight"])
    r = z.new_zeros(N, z.shape[1])
    for e in range(cfg.E):
        tok, slot = (topi == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        pe = m + f"experts.{e}."
        ye = mc.swiglu(z.index_select(0, tok), P[pe + "gate_proj.weight"], P[pe + "up_proj.weight"],
                       P[pe + "down_proj.weight"])
        r = r.index_add(0, tok, w[tok, slot][:, None] * ye)
    out = mc.linear(r, P[m + "latent_up_proj.weight"]) + mc.swiglu(
        xf, P[m + "shared_expert.gate_proj.weight"], P[m + "shared_expert.up_proj.weight"],
        P[m + "shared_expert.down_proj.weight"])
    with torch.no_grad():
        counts = torch.bincount(topi.reshape(-1), minlength=cfg.E).to(x.dtype)
    lb = (cfg.E / cfg.k) * (counts * p.mean(0)).sum() / N
    lse = torch.logsumexp(rl, dim=-1)
    rz = (lse * lse).sum() / N
    return out.view(B, T, d), dict(lb=lb, router_z=rz)


class FastHybrid:
    """Context manager swapping the reference's recurrent KDA and dense MoE for the faster forms."""

    def __enter__(self):
        self.saved = (om.kda_recurrent, om.moe_layer)
        om.kda_recurrent = kda_chunked_docs
        om.moe_layer = moe_layer_sparse
        return self

    def __exit__(self, *exc):
        om.kda_recurrent, om.moe_layer = self.saved


# --------------------------------------------------------------------------------------------- model
def final_hidden(P, cfg, kind, batch):
    """Residual stream after the last layer [B,T,d] and the per-MoE-layer aux dicts. The reference forward
    is called with a 1-row dummy LM head so that no full [B,T,V] logits are formed."""
    Pd = dict(P)
    Pd["lm_head.weight"] = P["lm_head.weight"][:1]
    if kind == "olmo3":
        _, hidden = o3.forward(Pd, cfg, batch, return_hidden=True)
        return hidden[-1], {}
    _, hidden, moe = om.forward(Pd, cfg, batch)
    return hidden[-1], moe


def micro_loss(P, cfg, kind, batch, total, ga, lc):
    h, moe = final_hidden(P, cfg, kind, batch)
    mask = batch["trained"].reshape(-1).bool()
    hs = h.reshape(-1, h.shape[-1])[mask]
    hn = mc.rmsnorm(hs, P["model.norm.weight"], cfg.eps)
    logits = mc.linear(hn, P["lm_head.weight"])  # [trained, V]
    tgt = batch["targets"].reshape(-1)[mask].long()
    lse = torch.logsumexp(logits, dim=-1)
    ce_sum = (lse - logits.gather(-1, tgt[:, None])[:, 0]).sum()
    z_sum = (lse * lse).sum()
    loss = (ce_sum + lc["lm_z"] * z_sum) / total
    lb = sum((i["lb"] for i in moe.values()), torch.zeros(()))
    rz = sum((i["router_z"] for i in moe.values()), torch.zeros(()))
    loss = loss + (lc["moe_lb"] * lb + lc["router_z"] * rz) / ga
    parts = dict(ce_sum=float(ce_sum), z_sum=float(z_sum), moe_lb=lc["moe_lb"] * float(lb) / ga,
                 router_z=lc["router_z"] * float(rz) / ga)
    return loss, parts


def run(args):
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(False)
    with open(os.path.join(args.dir, "config.json")) as f:
        raw = json.load(f)
    kind = raw["model_type"]
    cfg = o3.Cfg(raw) if kind == "olmo3" else om.Cfg(raw)
    W, _ = st.load(os.path.join(args.dir, "weights.safetensors"))
    P = {k: v.float().requires_grad_(True) for k, v in W.items()}
    del W
    Bt, meta = st.load(os.path.join(args.dir, "batch.safetensors"))
    ga, lc = int(meta["ga"]), json.loads(meta["loss"])
    rows = Bt["tokens"].shape[0]
    per = rows // ga
    micro = []
    for m in range(ga):
        sl = slice(m * per, (m + 1) * per)
        micro.append(dict(input_ids=Bt["tokens"][sl], segment_ids=Bt["segments"][sl],
                          position_ids=Bt["positions"][sl], targets=Bt["targets"][sl], trained=Bt["trained"][sl]))
    total = int(Bt["trained"].sum())
    tokens = rows * Bt["tokens"].shape[1]
    params = list(P.values())
    opt = torch.optim.AdamW(params, lr=lc["lr"], betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    base_kb = vm_kb("VmRSS")
    hwm_reset = reset_hwm()

    def step():
        for p in params:
            p.grad = None
        ce = z = lb = rz = 0.0
        for mb in micro:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
                loss, parts = micro_loss(P, cfg, kind, mb, total, ga, lc)
            loss.backward()
            ce += parts["ce_sum"]
            z += parts["z_sum"]
            lb += parts["moe_lb"]
            rz += parts["router_z"]
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return dict(ce=ce / total, lm_z=lc["lm_z"] * z / total, moe_lb=lb, router_z=rz, grad_norm=float(gn))

    ctx = FastHybrid() if kind == "olmo3moe" else None
    if ctx:
        ctx.__enter__()
    losses = [step()]  # warm-up (counted in the loss trajectory, not in the time)
    times, cpus = [], []
    for _ in range(args.steps):
        w0, c0 = time.perf_counter(), time.process_time()
        losses.append(step())
        times.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    if ctx:
        ctx.__exit__(None, None, None)
    wall = sum(times) / len(times)
    print(json.dumps({"impl": "torch", "torch": torch.__version__, "dtype": args.dtype,
                      "threads": torch.get_num_threads(),
                      "tokens_per_step": tokens, "trained_per_step": total, "steps": args.steps,
                      "sec_per_step": wall, "best_sec_per_step": min(times),
                      "cpu_sec_per_step": sum(cpus) / len(cpus), "tokens_per_s": tokens / wall,
                      "base_rss_kb": base_kb, "peak_rss_kb": vm_kb("VmHWM"),
                      "ru_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "hwm_reset_after_load": hwm_reset, "losses": losses}))


def check():
    """The faster hybrid forms against the reference forms, float64, on the reference's tiny fixture batch
    (3 + 2 documents over 2 rows, a 3-token document, boundaries inside chunks)."""
    torch.set_default_dtype(torch.float64)
    cfg = om.Cfg(om.TINY_CONFIG)
    batch, _ = om.make_batch(cfg)
    P0 = {k: v.double() for k, v in om.init_params(cfg).items()}

    def loss_grads():
        P = {k: v.clone().requires_grad_(True) for k, v in P0.items()}
        logits, _, moe = om.forward(P, cfg, batch)
        total, _, _, _ = om.total_loss(logits, moe, batch)
        total.backward()
        return float(total), {k: v.grad for k, v in P.items()}

    ref_loss, ref_g = loss_grads()
    with FastHybrid():
        fast_loss, fast_g = loss_grads()
    worst = max(float((fast_g[k] - ref_g[k]).abs().max() / (ref_g[k].abs().max() + 1e-300)) for k in ref_g)
    ok = abs(fast_loss - ref_loss) <= 1e-10 * abs(ref_loss) and worst <= 1e-8
    print(json.dumps({"ref_loss": ref_loss, "fast_loss": fast_loss, "worst_grad_rel": worst, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    if a.check:
        sys.exit(check())
    if not a.dir:
        ap.error("--dir is required")
    run(a)
