"""PyTorch peer of `bench_kda --gdn` (issue #30 item 4): transformers' own torch chunked Gated DeltaNet,
forward + autograd backward, on the shapes bench_kda runs, from the reference environment:

  deps/venv-reference/bin/python bench/gdn_torch.py --T 16384 --H 2 --K 96 --V 192 --threads 1 --reps 3

The kernel is `torch_chunk_gated_delta_rule` of transformers/models/olmo_hybrid/modeling_olmo_hybrid.py
(transformers 5.23, torch 2.15), called as OlmoHybridGatedDeltaNet calls it (use_qk_l2norm_in_kernel=True,
chunk 64; q, k, v, g, beta are the kernel's inputs: raw q/k before the L2 norm, the log-space decay per (token,
head), beta in (0, 2)). fla and causal_conv1d are hidden from import first, as in
tests/reference/hf_olmo_hybrid.py: when importable, transformers routes the kernel to fla's Triton code (which
crashes on this CPU). Upstream has no packed rows, so the T tokens are T/4096 documents of 4096 tokens as batch
rows (bench_kda's documents of 4096 in one packed row), the way a user of transformers would batch them.

Prints bench_kda's child line: "RESULT torch T fwd_wall bwd_wall fwd_cpu bwd_cpu peak_rss_kb base_rss_kb
checksum" (best of --reps for each of forward and backward; CPU = this process, all threads).
"""
import argparse
import resource
import sys
import time

for _pkg in ("fla", "causal_conv1d"):
    sys.modules[_pkg] = None

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from transformers.models.olmo_hybrid import modeling_olmo_hybrid as mh  # noqa: E402

DOC = 4096


def torch_path(fn):
    """The implementation a transformers hub-kernel wrapper resolved to at import time."""
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    return cells["implementation"].cell_contents if "implementation" in cells else fn


def peak_rss_kb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=16384)
    ap.add_argument("--H", type=int, default=2)
    ap.add_argument("--K", type=int, default=96)
    ap.add_argument("--V", type=int, default=192)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--A", type=float, default=8.0)
    ap.add_argument("--dt-bias", type=float, default=-4.6)
    ap.add_argument("--ftz", action="store_true", help="flush subnormals to zero (diagnostic)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.ftz:
        torch.set_flush_denormal(True)
    kernel = torch_path(mh.torch_chunk_gated_delta_rule)
    if kernel.__module__ != mh.__name__:
        sys.exit("gdn_torch.py: torch_chunk_gated_delta_rule resolved to %s, not transformers' torch code"
                 % kernel.__module__)
    B = max(1, a.T // DOC)
    L = a.T // B
    H, K, V = a.H, a.K, a.V
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(B, L, H, K, generator=gen).requires_grad_()
    k = torch.randn(B, L, H, K, generator=gen).requires_grad_()
    v = torch.randn(B, L, H, V, generator=gen).requires_grad_()
    dout = torch.randn(B, L, H, V, generator=gen)
    # As OlmoHybridGatedDeltaNet: g = -exp(A_log) * softplus(a + dt_bias) (--A, --dt-bias as bench_kda's),
    # beta = 2 sigmoid(b) (allow_neg_eigval); leaves, so the backward reaches them as ours does.
    g = (-a.A * F.softplus(torch.randn(B, L, H, generator=gen) + a.dt_bias)).requires_grad_()
    beta = (2.0 * torch.sigmoid(torch.randn(B, L, H, generator=gen))).requires_grad_()
    base = peak_rss_kb()
    tf = tb = cf = cb = 1e30
    out = None
    for _ in range(a.reps):
        for x in (q, k, v, g, beta):
            x.grad = None
        c0, t0 = time.process_time(), time.perf_counter()
        out, _ = kernel(q, k, v, g=g, beta=beta, chunk_size=a.chunk, initial_state=None,
                        output_final_state=False, use_qk_l2norm_in_kernel=True)
        c1, t1 = time.process_time(), time.perf_counter()
        out.backward(dout)
        c2, t2 = time.process_time(), time.perf_counter()
        tf, tb = min(tf, t1 - t0), min(tb, t2 - t1)
        cf, cb = min(cf, c1 - c0), min(cb, c2 - c1)
    cs = float(out.detach().reshape(-1)[::97].sum() + g.grad.reshape(-1)[::89].sum())
    print("NOTE torch %s, transformers %s, threads %d, %d rows of %d tokens\n"
          % (torch.__version__, transformers.__version__, torch.get_num_threads(), B, L), end="")
    print("RESULT torch %d %.6f %.6f %.6f %.6f %d %d %.9e" % (B * L, tf, tb, cf, cb, peak_rss_kb(), base, cs),
          flush=True)


if __name__ == "__main__":
    main()
