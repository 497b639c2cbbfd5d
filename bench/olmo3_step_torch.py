#!/usr/bin/env python3
"""PyTorch peer of an exported XLA step (scripts/accel-check.sh): the same Olmo 3 model config, batch shape and
dtype, as transformers' Olmo3ForCausalLM with PyTorch's SDPA attention, eager, forward + backward of the
mean token cross-entropy. Prints one line

  TORCH-STEP device=D model=olmo3 layers=L B=B T=T dtype=bf16 remat=0 step_s=.. tokens_per_s=.. tflops=..
  mfu=..

with the same model FLOPs per step as the XLA line (--flops, the manifest's), so the two MFUs compare the
same work. Or "TORCH-STEP skipped: <why>" when torch or transformers (with Olmo 3) is missing or the step
does not fit (the reason is printed, the exit code is 0: a missing peer is not a failure of the XLA run).

  python3 bench/olmo3_step_torch.py --config DIR/config.json --batch 1 --seq 8192 --dtype bf16 \
      --flops F --peak-tflops 989 [--remat] [--reps 3] [--device cuda]
"""
import argparse
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--flops", type=float, required=True, help="model FLOPs per step (the manifest's)")
    ap.add_argument("--peak-tflops", type=float, default=0.0)
    ap.add_argument("--remat", action="store_true", help="gradient checkpointing per layer")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    try:
        import torch
        from transformers import Olmo3Config, Olmo3ForCausalLM
    except Exception as e:  # noqa: BLE001
        print(f"TORCH-STEP skipped: {type(e).__name__}: {e}")
        return 0
    if a.device == "cuda" and not torch.cuda.is_available():
        print("TORCH-STEP skipped: no CUDA device")
        return 0
    with open(a.config) as f:
        cfg = Olmo3Config(**{k: v for k, v in json.load(f).items() if k not in ("architectures", "model_type")})
    cfg._attn_implementation = "sdpa"
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    torch.manual_seed(0)
    model = Olmo3ForCausalLM(cfg).to(device=a.device, dtype=dtype)
    if a.remat:
        model.gradient_checkpointing_enable()
    model.train()
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device=a.device)

    def step():
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if a.device == "cuda":
            torch.cuda.synchronize()

    try:
        step()  # warm-up
        best = float("inf")
        for _ in range(a.reps):
            t0 = time.perf_counter()
            step()
            best = min(best, time.perf_counter() - t0)
    except RuntimeError as e:  # out of memory, typically
        print(f"TORCH-STEP skipped: {str(e).splitlines()[0]}")
        return 0
    tflops = a.flops / best / 1e12
    mfu = tflops / a.peak_tflops if a.peak_tflops > 0 else 0.0
    print(f"TORCH-STEP device={a.device} model=olmo3 layers={cfg.num_hidden_layers} B={a.batch} T={a.seq} "
          f"dtype={a.dtype} remat={int(a.remat)} step_s={best:.4f} tokens_per_s={a.batch * a.seq / best:.1f} "
          f"tflops={tflops:.2f} mfu={mfu:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
