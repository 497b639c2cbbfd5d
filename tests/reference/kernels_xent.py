#!/usr/bin/env python3
"""Fixture for the fused LM-head softmax cross-entropy with z-loss and a padded vocabulary.

logits = h W[:valid]^T (padded rows of W excluded), per trained token (mask=1 and target != -100):
  ce = F.cross_entropy(logits, target, reduction='sum'),  z = sum(logsumexp(logits)^2)
The stored gradients are those of  scale * (ce + z_loss * z)  with respect to h and W (float64 autograd on
the float32 inputs); padded rows of W get zero gradient.
Run: /usr/bin/python3 tests/reference/kernels_xent.py
"""
import torch
import torch.nn.functional as F

from kernels_common import flat, rand32, write

g = torch.Generator().manual_seed(99)
N, d, V_rows, valid = 9, 16, 40, 37
z_loss, scale = 1e-2, 1.0 / 7.0  # a large z coefficient so its gradient term is visible
h = rand32(g, N, d)
W = rand32(g, V_rows, d, scale=0.8)
W[valid:] = 0.0  # zero padded rows: the +3.2 nats trap if they entered the softmax
targets = torch.randint(0, valid, (N,), generator=g, dtype=torch.int64)
targets[2] = valid - 1
mask = torch.ones(N, dtype=torch.uint8)
mask[0] = 0
mask[5] = 0
targets[7] = -100  # ignored via ignore_index (mask stays 1)

hd, Wd = h.double().requires_grad_(), W.double().requires_grad_()
logits = hd @ Wd[:valid].t()
trained = (mask == 1) & (targets != -100)
lt, tt = logits[trained], targets[trained]
ce = F.cross_entropy(lt, tt, reduction="sum")
lse = torch.logsumexp(lt, dim=-1)
z = (lse * lse).sum()
(scale * (ce + z_loss * z)).backward()
lse_all = torch.zeros(N, dtype=torch.float64)
lse_all[trained] = lse.detach()
# What the padded-rows trap would cost: CE with the zero rows left in the softmax.
ce_padded = F.cross_entropy((hd @ Wd.t())[trained], tt, reduction="sum")
write("xent.json", {"generator": "tests/reference/kernels_xent.py", "torch": torch.__version__,
                    "N": N, "d": d, "V_rows": V_rows, "valid_vocab": valid, "z_loss": z_loss, "scale": scale,
                    "h": flat(h), "W": flat(W), "targets": flat(targets), "mask": flat(mask),
                    "ce_sum": float(ce), "z_sum": float(z), "count": int(trained.sum()), "lse": flat(lse_all),
                    "dh": flat(hd.grad), "dW": flat(Wd.grad), "ce_sum_if_padded_rows_in_softmax": float(ce_padded)})
