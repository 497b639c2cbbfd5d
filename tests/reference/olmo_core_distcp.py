"""Upstream oracle for OLMo-core distributed checkpoints: OLMo-core 3.0.0's OWN model config and OWN checkpoint
writer (`save_model_and_optim_state`), run from the reference environment (deps/venv-reference; olmo-core is
installed there with --no-deps from deps/pypi/reference-olmo-core.txt by `scripts/install-deps.sh --reference`).

  deps/venv-reference/bin/python tests/reference/olmo_core_distcp.py

writes tests/golden/distcp/ (committed; the C++ suite never runs Python):
  olmo3_1proc/   a tiny Olmo 3 (TransformerConfig.olmo3_1M: d_model 12, 3 heads of head_dim 4, 1 kv head,
                 4 layers, SwiGLU hidden 40, vocab 264, sliding windows [6, 6, 6, -1] with the first and last layer full,
                 attention backend "torch"), random weights, float32, saved by one process (no process group):
                   config.json                 {"run_name", "model": TransformerConfig.as_config_dict(),
                                                "dataset": {"tokenizer": TokenizerConfig.as_config_dict()}}
                   model_and_optim/.metadata + __0_0.distcp   (model and AdamW state, as OLMo-core writes them)
  olmo3_2proc/   the same with 4 heads of head_dim 4 and 2 kv heads, rounded to bfloat16, FSDP2-sharded over 2 processes (torchrun
                 --nproc-per-node 2, gloo): every 2-D tensor is split along dim 0 across __0_0 and __1_0.
  oracle/        tensors_1proc.safetensors / tensors_2proc.safetensors: every model tensor under its OLMo-core
                 name, full, in the stored dtype; tokens.json (2 rows of 24 ids); expected_1proc.json /
                 expected_2proc.json: OLMo-core's own forward (float32) on those tokens as next-token
                 log-probs in `olmosft forward`'s format (logprobs[b][t] = log p(tok[t+1] | tok[..t]), null at
                 the last position) and the mean CE; olmo_core_hf_1proc.json: OLMo-core's own HF conversion
                 of the 1-process model (save_hf_model): its config's layer types / window and every HF tensor's
                 name, shape and sha256, and transformers' Olmo3ForCausalLM log-probs on it.
The AdamW step that creates the optimizer state uses lr = 0, so the saved weights are the ones the logits
were computed with. Deterministic seeds; one thread.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
OUT = os.path.join(REPO, "tests", "golden", "distcp")
PINNED_TORCH = "2.15.0"
PINNED_OLMO_CORE = "3.0.0"
SEED = 20261204
# 1 process: 3 heads x head_dim 4 = d_model (OLMo-core 3.0's get_hf_config drops head_dim, so its own HF
# conversion, the mapping oracle, needs head_dim = d_model / n_heads), 1 kv head. 2 processes: 4 heads of 4
# (q width 16 != d_model 12: head_dim must come from the config), 2 kv heads.
HEADS_1PROC, HEADS_2PROC = (3, 1), (4, 2)
B, T, V = 2, 24, 264  # V covers olmosft's builtin:bytes tokenizer (260 ids) so `olmosft train` can start


def die(msg):
    print("olmo_core_distcp.py: FAILED: " + msg, file=sys.stderr)
    sys.exit(1)


def build_config(n_heads, n_kv_heads):
    from olmo_core.nn.attention import SlidingWindowAttentionConfig
    from olmo_core.nn.transformer import TransformerConfig

    config = TransformerConfig.olmo3_1M(
        vocab_size=V,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        sliding_window=SlidingWindowAttentionConfig(
            pattern=[6, 6, 6, -1], force_full_attention_on_first_layer=True, force_full_attention_on_last_layer=True
        ),
        attn_backend="torch",
    )
    config.block.feed_forward.hidden_size = 40  # olmo3_1M's 256 would make the fixtures 5x larger
    return config


def build_model(config):
    torch.manual_seed(SEED)
    model = config.build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:  # norm gains: away from 1 so that swapped norms change the logits
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model


def tokens():
    g = torch.Generator().manual_seed(SEED + 2)
    return torch.randint(0, V, (B, T), generator=g)


def logprobs(model, ids):
    with torch.no_grad():
        logits = model(ids).float()
    lp = F.log_softmax(logits, dim=-1)
    rows, total, n = [], 0.0, 0
    for b in range(ids.shape[0]):
        row = []
        for t in range(ids.shape[1]):
            if t + 1 < ids.shape[1]:
                v = lp[b, t, ids[b, t + 1]].item()
                row.append(v)
                total -= v
                n += 1
            else:
                row.append(None)
        rows.append(row)
    return {"logprobs": rows, "mean_ce": total / n, "trained_targets": n}


def lr0_step(model, optim):
    # One AdamW step with lr = 0 so OLMo-core's checkpoint holds optimizer state but the weights are unchanged.
    ids = tokens()
    loss = F.cross_entropy(model(ids).float().view(-1, V), ids.view(-1))
    loss.backward()
    optim.step()
    optim.zero_grad()


def write_config(config, step_dir):
    # As OLMo-core's trainer writes it: the experiment config, with the model under "model" and the tokenizer
    # (OLMo-core's own TokenizerConfig; the ids of olmosft's builtin:bytes tokenizer) under "dataset".
    from olmo_core.data import TokenizerConfig

    tok = TokenizerConfig(vocab_size=V, eos_token_id=258, pad_token_id=259, identifier="olmosft builtin:bytes")
    os.makedirs(step_dir, exist_ok=True)
    exp = {"run_name": "olmosft-distcp-fixture", "model": config.as_config_dict(),
           "dataset": {"tokenizer": tok.as_config_dict()}}
    with open(os.path.join(step_dir, "config.json"), "w") as f:
        json.dump(exp, f, indent=2, sort_keys=True)
        f.write("\n")


def full_tensors(model):
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def save_oracle(name, model, tensors):
    from safetensors.torch import save_file

    os.makedirs(os.path.join(OUT, "oracle"), exist_ok=True)
    save_file(tensors, os.path.join(OUT, "oracle", f"tensors_{name}.safetensors"))
    ids = tokens()
    with open(os.path.join(OUT, "oracle", "tokens.json"), "w") as f:
        json.dump(ids.tolist(), f)
        f.write("\n")
    exp = logprobs(model, ids)
    exp["source"] = f"OLMo-core {PINNED_OLMO_CORE} Transformer forward (float32) of olmo3_{name}, torch {torch.__version__}"
    with open(os.path.join(OUT, "oracle", f"expected_{name}.json"), "w") as f:
        json.dump(exp, f)
        f.write("\n")


def olmo_core_hf_oracle(model):
    # OLMo-core's OWN HF conversion (olmo_core.nn.hf.checkpoint.save_hf_model: get_hf_config +
    # convert_state_to_hf + save_pretrained) of the 1-process model, and transformers' Olmo3ForCausalLM forward
    # on it: the reference for our name/config mapping (every tensor's sha256 and the config's layer types) and a
    # second logits oracle.
    import hashlib

    import transformers
    from olmo_core.nn.hf.checkpoint import save_hf_model
    from safetensors.torch import load_file
    from transformers import Olmo3ForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = os.path.join(tmp, "hf")
        save_hf_model(hf_dir, model.state_dict(), model)
        with open(os.path.join(hf_dir, "config.json")) as f:
            cfg = json.load(f)
        tensors = {}
        for fn in sorted(os.listdir(hf_dir)):
            if fn.endswith(".safetensors"):
                tensors.update(load_file(os.path.join(hf_dir, fn)))
        hf = Olmo3ForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32, attn_implementation="eager")
        hf.eval()
        ids = tokens()
        with torch.no_grad():
            logits = hf(ids).logits
        exp = logprobs(lambda x: logits, ids)
    exp["source"] = (f"transformers {transformers.__version__} Olmo3ForCausalLM (eager, float32) on OLMo-core "
                     f"{PINNED_OLMO_CORE}'s save_hf_model of olmo3_1proc")
    exp["hf_config"] = {k: cfg.get(k) for k in ("layer_types", "sliding_window", "num_key_value_heads", "head_dim",
                                                 "intermediate_size", "rms_norm_eps", "rope_theta")}
    exp["tensors"] = {n: {"shape": list(t.shape), "dtype": str(t.dtype),
                          "sha256": hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()}
                      for n, t in sorted(tensors.items())}
    with open(os.path.join(OUT, "oracle", "olmo_core_hf_1proc.json"), "w") as f:
        json.dump(exp, f, indent=1, sort_keys=True)
        f.write("\n")


def one_process():
    from olmo_core.distributed.checkpoint import save_model_and_optim_state

    config = build_config(*HEADS_1PROC)
    model = build_model(config)
    optim = torch.optim.AdamW(model.parameters(), lr=0.0, weight_decay=0.1)
    lr0_step(model, optim)
    step = os.path.join(OUT, "olmo3_1proc")
    shutil.rmtree(step, ignore_errors=True)
    write_config(config, step)
    save_model_and_optim_state(os.path.join(step, "model_and_optim"), model, optim)
    save_oracle("1proc", model, full_tensors(model))
    olmo_core_hf_oracle(model)


def two_process_worker():
    # Run by torchrun: each rank builds the same model, rounds it to bfloat16 and shards it with FSDP2.
    from olmo_core.distributed.checkpoint import save_model_and_optim_state
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    config = build_config(*HEADS_2PROC)
    model = build_model(config).to(torch.bfloat16)
    if rank == 0:
        ref = build_model(config).to(torch.bfloat16)
        tensors = full_tensors(ref)
        save_oracle("2proc", ref.float(), tensors)
    mesh = init_device_mesh("cpu", (2,))
    model.apply_fsdp(dp_mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=0.0, weight_decay=0.1)
    lr0_step(model, optim)
    step = os.path.join(OUT, "olmo3_2proc")
    if rank == 0:
        shutil.rmtree(step, ignore_errors=True)
        write_config(config, step)
    dist.barrier()
    save_model_and_optim_state(os.path.join(step, "model_and_optim"), model, optim)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true", help="internal: the torchrun worker of the 2-process save")
    a = ap.parse_args()
    torch.set_num_threads(1)
    from importlib.metadata import version

    if torch.__version__.split("+")[0] != PINNED_TORCH or version("ai2-olmo-core") != PINNED_OLMO_CORE:
        die(f"expected torch {PINNED_TORCH} and olmo-core {PINNED_OLMO_CORE}, got {torch.__version__} and "
            f"{version('ai2-olmo-core')}")
    if a.worker:
        two_process_worker()
        return
    one_process()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", "29531", os.path.abspath(__file__),
                    "--worker"], check=True, env=env)
    total = 0
    for root, _, files in os.walk(OUT):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print(f"olmo_core_distcp.py: wrote {OUT} ({total} bytes)")
    if total > 2_000_000:
        die(f"fixtures are {total} bytes (keep them under 2 MB)")


if __name__ == "__main__":
    main()
