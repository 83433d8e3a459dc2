#!/usr/bin/env python3
"""Hugging Face's GPT-2 as the outside reference for `ladder gpt2 check --reference DIR`.

Builds `GPT2LMHeadModel` from a config with a fixed seed (no download), saves its weights as
DIR/model.safetensors, runs a batch of random prompts and writes:

  meta.json            {"model", "seed", "tokens": [[...]] (B prompts of T ids), "greedy": [[...]]
                        (Hugging Face's greedy continuation, `steps` ids per prompt), "greedy_bf16":
                        [[...]] (the bf16 model's argmax at each of those steps)}
  prefill_logits.f32   the prompts' logits [B, T, V], little-endian float32
  decode_logits.f32    each greedy step's last-position logits [steps, B, V]
  prefill_logits_bf16.f32, decode_logits_bf16.f32
                       the same from the model cast to bf16, fed the fp32 run's greedy tokens (one
                       forward over prompt + continuation: step s's logits are position T - 1 + s's)

The reference runs in fp32 with TF32 off and the eager attention, so the numbers are the model's, not
a fast kernel's; the bf16 run (same eager attention) is the yardstick a bf16 plan is held to. Run it where torch and transformers are installed (the GPU machine):

  python3 scripts/gpt2_reference.py --out /tmp/gpt2-ref [--model gpt2] [--batch 2] [--prompt-len 64]
"""
import argparse
import copy
import json
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel

CONFIGS = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="gpt2", choices=sorted(CONFIGS))
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--steps", type=int, default=16)
    a = p.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(a.seed)
    cfg = GPT2Config(**CONFIGS[a.model], vocab_size=50257, n_positions=1024, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0)
    cfg._attn_implementation = "eager"  # the plain softmax(QK^T)V path, not a fused kernel
    model = GPT2LMHeadModel(cfg).eval()
    os.makedirs(a.out, exist_ok=True)
    model.save_pretrained(a.out, safe_serialization=True)
    model = model.to(dev)

    g = torch.Generator().manual_seed(a.seed + 1)
    tokens = torch.randint(0, cfg.vocab_size, (a.batch, a.prompt_len), generator=g)
    seq = tokens.to(dev)
    steps, greedy = [], []
    with torch.no_grad():
        prefill = model(seq).logits.float()
        last = prefill[:, -1, :]
        for _ in range(a.steps):
            steps.append(last.cpu())
            nxt = last.argmax(dim=-1, keepdim=True)
            greedy.append(nxt.cpu())
            seq = torch.cat([seq, nxt], dim=1)
            last = model(seq).logits[:, -1, :].float()
    prefill.cpu().numpy().astype("<f4").tofile(os.path.join(a.out, "prefill_logits.f32"))
    torch.stack(steps).numpy().astype("<f4").tofile(os.path.join(a.out, "decode_logits.f32"))
    greedy = torch.cat(greedy, dim=1)

    model16 = copy.deepcopy(model).to(torch.bfloat16)
    with torch.no_grad():
        logits16 = model16(torch.cat([tokens, greedy], dim=1).to(dev)).logits.float()
    t = a.prompt_len
    decode16 = logits16[:, t - 1:t - 1 + a.steps, :].transpose(0, 1).contiguous()  # [steps, B, V]
    logits16[:, :t, :].cpu().numpy().astype("<f4").tofile(os.path.join(a.out, "prefill_logits_bf16.f32"))
    decode16.cpu().numpy().astype("<f4").tofile(os.path.join(a.out, "decode_logits_bf16.f32"))
    greedy16 = decode16.argmax(dim=-1).transpose(0, 1)  # [B, steps]
    meta = dict(model=a.model, seed=a.seed, tokens=tokens.tolist(), greedy=greedy.tolist(),
                greedy_bf16=greedy16.tolist())
    with open(os.path.join(a.out, "meta.json"), "w") as f:
        json.dump(meta, f)
    top2 = torch.stack(steps).topk(2, dim=-1).values
    rel = lambda x, y: ((x - y).norm() / y.norm()).item()
    print(f"wrote {a.out}: {a.model}, B={a.batch}, T={a.prompt_len}, {a.steps} greedy steps; "
          f"smallest top-1/top-2 logit gap {(top2[..., 0] - top2[..., 1]).min().item():.3e}; "
          f"HF bf16 vs fp32: prefill rel L2 {rel(logits16[:, :t, :].cpu(), prefill.cpu()):.3e}, "
          f"worst step {max(rel(decode16[j].cpu(), steps[j]) for j in range(a.steps)):.3e}, "
          f"greedy tokens agreeing {(greedy16.cpu() == greedy).float().mean().item():.2f}")


if __name__ == "__main__":
    main()
