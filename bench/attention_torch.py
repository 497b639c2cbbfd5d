#!/usr/bin/python3
"""PyTorch counterpart of bench/attention.cpp: the same shapes, forward + backward through autograd.

PyTorch 1.13 (Debian) has no scaled_dot_product_attention, so this is the materialised form:
scores [H, T, T] + additive causal/window mask, softmax, @ v. Prints lines in the bench's table format.
"""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    T, H, Hkv, D = a.seq, 4, 2, 64
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, H, T, D, generator=g).requires_grad_()
    k = torch.randn(1, Hkv, T, D, generator=g).requires_grad_()
    v = torch.randn(1, Hkv, T, D, generator=g).requires_grad_()
    dout = torch.randn(1, H, T, D, generator=g)
    i = torch.arange(T).view(T, 1)
    j = torch.arange(T).view(1, T)
    for W in (0, 1024):
        vis = j <= i
        if W > 0:
            vis = vis & (i - j < W)
        mask = torch.zeros(T, T).masked_fill(~vis, float("-inf"))
        pairs = float(vis.sum())
        best_f = best_b = cpu_f = cpu_b = 1e30
        for rep in range(a.reps + 1):
            q.grad = k.grad = v.grad = None
            c0, t0 = time.process_time(), time.perf_counter()
            kk = k.repeat_interleave(H // Hkv, dim=1)
            vv = v.repeat_interleave(H // Hkv, dim=1)
            s = torch.matmul(q, kk.transpose(-1, -2)) * (D ** -0.5) + mask
            o = torch.matmul(torch.softmax(s, dim=-1), vv)
            c1, t1 = time.process_time(), time.perf_counter()
            o.backward(dout)
            c2, t2 = time.process_time(), time.perf_counter()
            del s, o
            if rep > 0:
                best_f, best_b = min(best_f, t1 - t0), min(best_b, t2 - t1)
                cpu_f, cpu_b = min(cpu_f, c1 - c0), min(cpu_b, c2 - c1)
        name = "win1024" if W else "full"
        print("%-10s %-6s %9.2f %9.2f %12.0f %10.1f %10.1f %9.2f %9.2f %14.0f" % (
            name, "torch", best_f * 1e3, best_b * 1e3, T / (best_f + best_b),
            4 * pairs * H * D / best_f * 1e-9, 10 * pairs * H * D / best_b * 1e-9,
            cpu_f * 1e3, cpu_b * 1e3, T / (cpu_f + cpu_b)), flush=True)
    print("torch %s, threads %d, materialised [H,T,T] scores (no SDPA in this version)" % (torch.__version__, a.threads))


if __name__ == "__main__":
    main()
