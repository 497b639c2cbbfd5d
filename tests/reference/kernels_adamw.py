#!/usr/bin/env python3
"""Fixture for global-norm clipping + AdamW: torch.nn.utils.clip_grad_norm_ then torch.optim.AdamW,
float32, several steps, two parameter groups (weight decay on / off). Gradients per step are stored
(they are inputs: the kernel does not compute them). The first steps clip (norm > max_norm), later
ones do not (small gradients).
Run: /usr/bin/python3 tests/reference/kernels_adamw.py
"""
import torch

from kernels_common import flat, rand32, write

g = torch.Generator().manual_seed(7)
lr, betas, eps, wd, max_norm, steps = 1e-2, (0.9, 0.95), 1e-8, 0.1, 1.0, 5
p_decay = torch.nn.Parameter(rand32(g, 6, 5))
p_nodecay = torch.nn.Parameter(rand32(g, 7))
init = [flat(p_decay), flat(p_nodecay)]
opt = torch.optim.AdamW([{"params": [p_decay], "weight_decay": wd}, {"params": [p_nodecay], "weight_decay": 0.0}],
                        lr=lr, betas=betas, eps=eps, foreach=False)
record = []
for s in range(steps):
    gscale = 2.0 if s < 2 else 0.05
    ga, gb = rand32(g, 6, 5, scale=gscale), rand32(g, 7, scale=gscale)
    p_decay.grad, p_nodecay.grad = ga.clone(), gb.clone()
    norm = torch.nn.utils.clip_grad_norm_([p_decay, p_nodecay], max_norm)
    opt.step()
    st_a, st_b = opt.state[p_decay], opt.state[p_nodecay]
    record.append({"grads": [flat(ga), flat(gb)], "norm": float(norm), "params": [flat(p_decay), flat(p_nodecay)],
                   "m": [flat(st_a["exp_avg"]), flat(st_b["exp_avg"])],
                   "v": [flat(st_a["exp_avg_sq"]), flat(st_b["exp_avg_sq"])]})
write("adamw.json", {"generator": "tests/reference/kernels_adamw.py", "torch": torch.__version__, "lr": lr,
                     "beta1": betas[0], "beta2": betas[1], "eps": eps, "weight_decay": wd, "max_norm": max_norm,
                     "decay": [True, False], "init": init, "steps": record})
