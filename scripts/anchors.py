#!/usr/bin/env python3
"""Times the PyTorch equivalents of kernel-ladder's ops at the families' default shapes and writes
JSON that `ladder run --anchors FILE` shows as extra rows. Needs only torch with CUDA.

    python3 scripts/anchors.py --out anchors.json [--family norm,attention,attention-prefill-bf16,attention-decode,quant-int4,matmul-gemv,gpt2]
    (also: attention-prefill-bf16-fa3, matmul-gemv-fp8, matmul-linear-fp8, gpt2-sizes: the compiled decode step at
    gpt2-medium, -large, -xl)

Timing mirrors the harness: CUDA events around each call after warm-up, the median (with min and
max) of many calls, rotating through enough copies of the inputs that they do not sit in L2.
The `shape` strings must equal the ops' shape strings (`ladder list` prints them).
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F


def rotation(nbytes):
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(1, min(64, -(-3 * l2 // max(1, nbytes))))


GATE_BELOW_MS = 0.05  # as the harness (crates/common/src/timing.rs)
GATED_BATCH = 100


def time_fn(fns, target_ms=300.0, min_reps=10, max_reps=500):
    """fns: one callable per copy; returns (median, min, max) in ms. Calls shorter than 50 us are
    enqueued in batches of 100 behind torch.cuda._sleep (the harness's gate), sized from the host's
    own enqueue time, so the device runs them back to back and Python's launch rate is not timed."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for f in fns[:3]:
        f()
    # The estimate itself behind a short sleep, so Python's launch time is not in it.
    torch.cuda._sleep(int(1e6))
    start.record()
    fns[0]()
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end), 1e-3)
    reps = int(min(max(target_ms / est, min_reps), max_reps))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    gated = est < GATE_BELOW_MS
    batch = GATED_BATCH if gated else reps
    host_s = 0.0
    if gated:
        # The host's time to enqueue one timed call, to size the sleep that holds the stream.
        t0 = time.perf_counter()
        for i in range(20):
            s, e = events[i % reps]
            s.record()
            fns[i % len(fns)]()
            e.record()
        host_s = (time.perf_counter() - t0) / 20
        torch.cuda.synchronize()
    for b0 in range(0, reps, batch):
        if gated:
            torch.cuda._sleep(int(3 * batch * host_s * 2e9))  # ~2 GHz SM clock, 3x margin
        for i in range(b0, min(b0 + batch, reps)):
            s, e = events[i]
            s.record()
            fns[i % len(fns)]()
            e.record()
    torch.cuda.synchronize()
    t = sorted(s.elapsed_time(e) for s, e in events)
    n = len(t)
    med = t[n // 2] if n % 2 else 0.5 * (t[n // 2 - 1] + t[n // 2])
    return med, t[0], t[-1]


def anchor(family, op, shape, name, fns):
    med, lo, hi = time_fn(fns)
    print(f"{family}/{op} {shape} {name}: {med * 1e3:.1f} us")
    return dict(family=family, op=op, shape=shape, name=name, median_ms=med, min_ms=lo, max_ms=hi)


def norm():
    out = []
    for rows, c in [(4096, 768), (32768, 4096)]:
        copies = rotation(2 * rows * c * 4)
        xs = [torch.randn(rows, c, device="cuda") for _ in range(copies)]
        w, b = torch.randn(c, device="cuda"), torch.randn(c, device="cuda")
        fns = [lambda x=x: F.layer_norm(x, (c,), w, b, 1e-5) for x in xs]
        out.append(anchor("norm", "layernorm", f"rows={rows},C={c}", "torch layer_norm", fns))
    for rows, t, causal in [(4 * 12 * 1024, 1024, 1), (32768, 4096, 0)]:
        copies = rotation(2 * rows * t * 4)
        xs = [torch.randn(rows, t, device="cuda") for _ in range(copies)]
        if causal:
            # The same masked, scaled softmax as the kernels: positions past the row's are -inf.
            mask = torch.full((t, t), float("-inf"), device="cuda").triu(1).repeat(rows // t, 1)
            fns = [lambda x=x: torch.softmax(x * 0.125 + mask, dim=-1) for x in xs]
            name = "torch softmax(x*s + causal mask)"
        else:
            fns = [lambda x=x: torch.softmax(x * 0.125, dim=-1) for x in xs]
            name = "torch softmax(x*s)"
        out.append(anchor("norm", "softmax", f"rows={rows},T={t},causal={causal}", name, fns))
    return out


def attention():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = []
    for b, t, nh, hs in [(4, 1024, 12, 64), (4, 64, 12, 64), (4, 256, 12, 64)]:
        copies = rotation(4 * b * t * nh * hs * 4)
        qkvs = [torch.randn(3, b, nh, t, hs, device="cuda") for _ in range(copies)]
        shape = f"B={b},T={t},NH={nh},HS={hs},W=128"
        for backend, name in [(SDPBackend.EFFICIENT_ATTENTION, "torch sdpa (mem-efficient)"), (SDPBackend.MATH, "torch sdpa (math)")]:
            def run(qkv, backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
            out.append(anchor("attention", "prefill", shape, name, [lambda q=q: run(q) for q in qkvs]))
    return out


def attention_prefill_bf16(shapes=((4, 1024, 12, 64, 1), (4, 1000, 12, 64, 1), (8, 2048, 16, 128, 1),
                                   (8, 2048, 16, 128, 0), (1, 16384, 16, 128, 1))):
    """SDPA in bf16 on the op's own layout: q, k and v are strided views of one qkv[B, T, 3, NH, HS]
    tensor (as the kernels read them), at attention/prefill-bf16's default shapes; cuDNN and flash."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = []
    for b, t, nh, hs, causal in shapes:
        copies = rotation(2 * 4 * b * t * nh * hs)
        qkvs = [torch.randn(b, t, 3, nh, hs, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        shape = f"B={b},T={t},NH={nh},HS={hs},causal={causal}"
        for backend, name in [(SDPBackend.CUDNN_ATTENTION, "torch sdpa bf16 (cuDNN)"), (SDPBackend.FLASH_ATTENTION, "torch sdpa bf16 (flash)")]:
            def run(qkv, backend=backend):
                q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
            try:
                out.append(anchor("attention", "prefill-bf16", shape, name, [lambda q=q: run(q) for q in qkvs]))
            except RuntimeError as e:
                print(f"attention/prefill-bf16 {shape} {name}: not available ({str(e).splitlines()[0]})")
    return out


def attention_prefill_bf16_fa3():
    """The same anchors at FlashAttention-3's benchmark shapes: 16k tokens a batch, 32 heads of 64
    or 16 of 128, T = 1k, 4k and 16k, causal and not (`ladder run ... --shape` each)."""
    return attention_prefill_bf16([(16384 // t, t, nh, hs, causal) for nh, hs in [(32, 64), (16, 128)]
                                   for t in [1024, 4096, 16384] for causal in [1, 0]])


def attention_decode():
    """SDPA on the contiguous bf16 caches of the decode tables ([B, T, HKV, D], viewed as
    [B, HKV, T, D]), one query token, both fused backends; the ragged shape has no anchor (SDPA
    would need a mask)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    out = []
    shapes = [(1, 12, 12, 64, 1024), (8, 12, 12, 64, 1024), (64, 12, 12, 64, 1024), (16, 32, 32, 128, 8192),
              (32, 32, 4, 128, 8192), (128, 32, 4, 128, 8192)]
    for b, hq, hkv, d, t in shapes:
        shape = f"B={b},HQ={hq},HKV={hkv},D={d},seq={t},ragged=0,bs=16,dtype=0,alibi=0,splits=0"
        copies = rotation(2 * b * t * hkv * d * 2)
        kvs = [(torch.randn(b, t, hkv, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2),
                torch.randn(b, t, hkv, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)) for _ in range(copies)]
        q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
        for backend, name in [(SDPBackend.CUDNN_ATTENTION, "torch sdpa bf16 (cuDNN)"), (SDPBackend.FLASH_ATTENTION, "torch sdpa bf16 (flash)")]:
            def run(k, v, backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv)
            try:
                out.append(anchor("attention", "decode", shape, name, [lambda k=k, v=v: run(k, v) for k, v in kvs]))
            except RuntimeError as e:
                print(f"{name} at {shape}: not available ({str(e).splitlines()[0]})")
        del kvs, q
    return out


def quant_int4():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = []
    hq, hkv, d, t = 8, 1, 128, 8192
    for b in [32, 128, 512]:
        k = torch.randn(b, hkv, t, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, hkv, t, d, device="cuda", dtype=torch.bfloat16)
        q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
        for backend, name in [(SDPBackend.CUDNN_ATTENTION, "torch sdpa gqa bf16 (cuDNN)"), (SDPBackend.FLASH_ATTENTION, "torch sdpa gqa bf16 (flash)")]:
            def run(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            try:
                a = anchor("quant-int4", "decode", f"B={b}", name, [run])
            except RuntimeError as e:
                print(f"{name} at B={b}: not available ({str(e).splitlines()[0]})")
                continue
            # The same bf16-cache timing is the anchor of the row-wise and group-wise tables.
            for fmt in (0, 1, 4):
                out.append(dict(a, shape=f"B={b},Tmax={t},seq={t},ragged=0,HQ={hq},HKV={hkv},D={d},fmt={fmt},splits=0"))
        del k, v, q
    return out


def matmul_gemv():
    """The decode GEMV's shapes: torch's bf16 linear (cuBLAS on bf16 activations and weights), and a
    device-to-device copy that moves as many bytes as the GEMV reads of W (half read, half written):
    the copy rate at this size, which launch and ramp bound as they bound the GEMV."""
    out = []
    for m, n, k, bias in [(1, 2304, 768, 1), (1, 768, 768, 1), (1, 3072, 768, 1), (1, 768, 3072, 1),
                          (1, 50257, 768, 0), (8, 3072, 768, 1), (32, 3072, 768, 1)]:
        shape = f"M={m},N={n},K={k},bias={bias}"
        copies = rotation(2 * n * k)
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
        out.append(anchor("matmul", "gemv", shape, "torch linear bf16 (cuBLAS)",
                          [lambda w=w: F.linear(x, w, b) for w in ws]))
        srcs = [torch.empty(n * k, device="cuda", dtype=torch.uint8) for _ in range(copies)]
        dst = torch.empty(n * k, device="cuda", dtype=torch.uint8)
        out.append(anchor("matmul", "gemv", shape, "copy of W's bytes (same-size copy rate)",
                          [lambda s=s: dst.copy_(s) for s in srcs]))
        del ws, srcs
    return out


def matmul_gemv_fp8():
    """gemv-fp8's shapes: a device-to-device copy that moves as many bytes as the GEMV reads of its
    e4m3 weights (N * K codes: half read, half written), and torch's bf16 linear (cuBLAS) that the
    bf16 GEMV replaces, for the ratio a decode step gains from 1-byte weights."""
    out = []
    for m, n, k, bias in [(1, 2304, 768, 1), (1, 768, 768, 1), (1, 3072, 768, 1), (1, 768, 3072, 1),
                          (1, 50257, 768, 0), (8, 3072, 768, 1), (32, 3072, 768, 1)]:
        shape = f"M={m},N={n},K={k},bias={bias}"
        copies = rotation(n * k)
        srcs = [torch.empty(n * k // 2, device="cuda", dtype=torch.uint8) for _ in range(copies)]
        dst = torch.empty(n * k // 2, device="cuda", dtype=torch.uint8)
        out.append(anchor("matmul", "gemv-fp8", shape, "copy of W's e4m3 bytes (same-size copy rate)",
                          [lambda s=s: dst.copy_(s) for s in srcs]))
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(rotation(2 * n * k))]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
        out.append(anchor("matmul", "gemv-fp8", shape, "torch linear bf16 (cuBLAS, 2-byte W)",
                          [lambda w=w: F.linear(x, w, b) for w in ws]))
        del ws, srcs
    return out


def matmul_linear_fp8():
    """linear-fp8's shapes: torch._scaled_mm on e4m3 operands (cuBLASLt FP8) with per-tensor scales
    and with row-wise scales (one per row of A, one per column of the output), and with DeepSeek's
    block-wise scales (torch's scaled_mm), bf16 out; and torch's bf16 linear for the same shape. _scaled_mm needs every dimension a multiple of 16: the LM head's
    N = 50257 runs at 50272."""
    out = []
    e4m3 = torch.float8_e4m3fn
    for m, n, k, bias in [(4096, 2304, 768, 1), (4096, 768, 768, 1), (4096, 3072, 768, 1), (4096, 768, 3072, 1),
                          (4096, 50257, 768, 0), (4096, 4096, 4096, 0), (8192, 8192, 8192, 0)]:
        shape = f"M={m},N={n},K={k},bias={bias}"
        n16 = -(-n // 16) * 16
        copies = rotation(m * k + n16 * k)
        a_s = [torch.randn(m, k, device="cuda").to(e4m3) for _ in range(copies)]
        w_s = [torch.randn(n16, k, device="cuda").to(e4m3) for _ in range(copies)]
        one = torch.tensor(1.0, device="cuda")
        rows, cols = torch.ones(m, 1, device="cuda"), torch.ones(1, n16, device="cuda")
        b = torch.randn(n16, device="cuda", dtype=torch.bfloat16) if bias else None
        for name, sa, sb in [("per-tensor", one, one), ("row-wise", rows, cols)]:
            try:
                fns = [lambda a=a, w=w, sa=sa, sb=sb: torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, bias=b,
                                                                      out_dtype=torch.bfloat16)
                       for a, w in zip(a_s, w_s)]
                out.append(anchor("matmul", "linear-fp8", shape, f"torch._scaled_mm e4m3 {name} (cuBLASLt FP8)", fns))
            except RuntimeError as e:
                print(f"matmul/linear-fp8 {shape} {name}: {e}")
        # DeepSeek's scales, as linear-fp8 uses them (1 x 128 on A, 128 x 128 on W; cuBLASLt's
        # VEC128 / BLK128x128 path, sm_90 only): torch's scaled_mm API, no bias.
        try:
            from torch.nn.functional import scaled_mm, ScalingType, SwizzleType
            groups = -(-k // 128)
            a_scale = torch.ones(groups, m, device="cuda").t()  # [M, groups], M contiguous
            w_scale = torch.ones(-(-n16 // 128), -(-groups // 4) * 4, device="cuda")  # K groups padded to 4
            fns = [lambda a=a, w=w: scaled_mm(a, w.t(), a_scale, ScalingType.BlockWise1x128, w_scale.t(),
                                              ScalingType.BlockWise128x128, swizzle_a=SwizzleType.NO_SWIZZLE,
                                              swizzle_b=SwizzleType.NO_SWIZZLE, output_dtype=torch.bfloat16)
                   for a, w in zip(a_s, w_s)]
            out.append(anchor("matmul", "linear-fp8", shape, "torch scaled_mm e4m3 block-wise 1x128 / 128x128 (cuBLASLt FP8)", fns))
        except (ImportError, RuntimeError, TypeError) as e:
            print(f"matmul/linear-fp8 {shape} block-wise: {e}")
        del a_s, w_s
        xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(rotation(2 * (m * k + n * k)))]
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        bb = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
        out.append(anchor("matmul", "linear-fp8", shape, "torch linear bf16 (cuBLAS)", [lambda x=x: F.linear(x, w, bb) for x in xs]))
        del xs, w
        torch.cuda.empty_cache()
    return out


def gpt2():
    """Hugging Face's GPT-2 124M (seeded random init, no download) at the model table's shapes:
    the prefill of B=4 x 1024 tokens (fp16 and fp32), and one decode step at batch 1, 8 and 32 from
    a 1000-token cache, timed on the host clock around the step with the last position's logits
    copied to the host (as `ladder run gpt2 --op model` times its own): eager with the dynamic
    cache in fp32 and bf16, and a static cache with `torch.compile(mode="reduce-overhead")` (CUDA
    graphs) in bf16; and the bf16 prefill under `torch.compile`. Shapes are `prefill B=4,T=1024`
    and `decode b=N`."""
    import time

    from transformers import GPT2Config, GPT2LMHeadModel

    out = []
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_positions=1024)
    base = GPT2LMHeadModel(cfg).eval().cuda()

    def entry(shape, name, samples):
        samples = sorted(samples)
        n = len(samples)
        med = samples[n // 2] if n % 2 else 0.5 * (samples[n // 2 - 1] + samples[n // 2])
        print(f"gpt2/model {shape} {name}: {med:.3f} ms")
        return dict(family="gpt2", op="model", shape=shape, name=name, median_ms=med, min_ms=samples[0], max_ms=samples[-1])

    for dtype, label in [(torch.float16, "fp16"), (torch.float32, "fp32")]:
        m = base.to(dtype)
        ids = [torch.randint(0, 50257, (4, 1024), device="cuda") for _ in range(3)]
        with torch.no_grad():
            med, lo, hi = time_fn([lambda x=x: m(x, use_cache=False) for x in ids], target_ms=500.0, min_reps=5)
        out.append(dict(family="gpt2", op="model", shape="prefill B=4,T=1024", name=f"HF eager {label}",
                        median_ms=med, min_ms=lo, max_ms=hi))
        print(f"gpt2/model prefill HF eager {label}: {med:.2f} ms")

    start, steps, warm = 1000, 20, 3

    def decode(m, b, step_fn, prefill_fn):
        tok = torch.randint(0, 50257, (b, 1), device="cuda")
        state = prefill_fn(torch.randint(0, 50257, (b, start), device="cuda"))
        samples = []
        for i in range(warm + steps):
            t0 = time.perf_counter()
            logits, state = step_fn(tok, start + i, state)
            logits[:, -1, :].float().cpu()
            if i >= warm:
                samples.append((time.perf_counter() - t0) * 1e3)
        return samples

    for dtype, label in [(torch.float32, "fp32"), (torch.bfloat16, "bf16")]:
        m = base.to(dtype)
        for b in [1, 8, 32]:
            def prefill(x):
                with torch.no_grad():
                    return m(x, use_cache=True).past_key_values

            def step(tok, pos, past):
                with torch.no_grad():
                    o = m(tok, past_key_values=past, use_cache=True)
                return o.logits, o.past_key_values
            out.append(entry(f"decode b={b}", f"HF eager {label}", decode(m, b, step, prefill)))

    # Static cache + torch.compile(mode="reduce-overhead"): the decode step replayed as CUDA graphs.
    m = base.to(torch.bfloat16)
    try:
        from transformers import StaticCache
        for b in [1, 8, 32]:
            try:
                cache = StaticCache(config=cfg, max_batch_size=b, max_cache_len=1024, device="cuda", dtype=torch.bfloat16)
            except TypeError:
                cache = StaticCache(config=cfg, max_cache_len=1024)

            def fwd(tok, pos):
                return m(tok, past_key_values=cache, cache_position=pos, use_cache=True).logits
            compiled = torch.compile(fwd, mode="reduce-overhead")

            def prefill(x):
                with torch.no_grad():
                    m(x, past_key_values=cache, cache_position=torch.arange(start, device="cuda"), use_cache=True)
                return None

            def step(tok, pos, state):
                with torch.no_grad():
                    logits = compiled(tok, torch.tensor([pos], device="cuda"))
                return logits.clone(), state
            t0 = time.perf_counter()
            samples = decode(m, b, step, prefill)
            print(f"  (static+compile b={b}: {time.perf_counter() - t0:.1f} s with compilation)")
            out.append(entry(f"decode b={b}", "HF static cache + torch.compile reduce-overhead bf16", samples))
    except Exception as e:  # noqa: BLE001 - report and keep the other anchors
        print(f"HF static cache + torch.compile: not available ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")

    # The prefill in bf16 (SDPA attention) under torch.compile's default mode, every position's
    # logits: the anchor the bf16 model's prefill is measured against.
    m = base.to(torch.bfloat16)
    try:
        compiled = torch.compile(m)
        ids = [torch.randint(0, 50257, (4, 1024), device="cuda") for _ in range(3)]
        with torch.no_grad():
            t0 = time.perf_counter()
            for x in ids:
                compiled(x, use_cache=False)
            print(f"  (compiled prefill: {time.perf_counter() - t0:.1f} s with compilation)")
            med, lo, hi = time_fn([lambda x=x: compiled(x, use_cache=False) for x in ids], target_ms=500.0, min_reps=5)
        out.append(dict(family="gpt2", op="model", shape="prefill B=4,T=1024", name="HF bf16 + torch.compile",
                        median_ms=med, min_ms=lo, max_ms=hi))
        print(f"gpt2/model prefill HF bf16 + torch.compile: {med:.2f} ms")
    except Exception as e:  # noqa: BLE001 - report and keep the other anchors
        print(f"HF bf16 + torch.compile prefill: not available ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    return out


GPT2_SIZES = {"gpt2-medium": (24, 16, 1024), "gpt2-large": (36, 20, 1280), "gpt2-xl": (48, 25, 1600)}


def gpt2_sizes(names, batches=(1,)):
    """The compiled decode step at the larger GPT-2 sizes (seeded random init, no download), as
    `gpt2()` times it at 124M: Hugging Face's static cache under `torch.compile(mode="reduce-overhead")`
    in bf16, one step from a 1000-token cache on the host clock with the logits copied back. Shapes
    are `decode b=N,model=NAME`: `ladder run gpt2 --op model --model NAME` shows the ones of its own
    model. Batch 1 only by default: each size and batch is a compile of its own (~1 min)."""
    import time

    from transformers import GPT2Config, GPT2LMHeadModel, StaticCache

    out = []
    start, steps, warm = 1000, 20, 3
    for name in names:
        layers, heads, c = GPT2_SIZES[name]
        torch.manual_seed(0)
        cfg = GPT2Config(n_layer=layers, n_head=heads, n_embd=c, vocab_size=50257, n_positions=1024)
        m = GPT2LMHeadModel(cfg).eval().cuda().to(torch.bfloat16)
        for b in batches:
            try:
                try:
                    cache = StaticCache(config=cfg, max_batch_size=b, max_cache_len=1024, device="cuda",
                                        dtype=torch.bfloat16)
                except TypeError:
                    cache = StaticCache(config=cfg, max_cache_len=1024)

                def fwd(tok, pos, cache=cache):
                    return m(tok, past_key_values=cache, cache_position=pos, use_cache=True).logits
                compiled = torch.compile(fwd, mode="reduce-overhead")
                with torch.no_grad():
                    m(torch.randint(0, 50257, (b, start), device="cuda"), past_key_values=cache,
                      cache_position=torch.arange(start, device="cuda"), use_cache=True)
                tok = torch.randint(0, 50257, (b, 1), device="cuda")
                samples = []
                t_all = time.perf_counter()
                for i in range(warm + steps):
                    t0 = time.perf_counter()
                    with torch.no_grad():
                        logits = compiled(tok, torch.tensor([start + i], device="cuda")).clone()
                    logits[:, -1, :].float().cpu()
                    if i >= warm:
                        samples.append((time.perf_counter() - t0) * 1e3)
                samples.sort()
                med = samples[len(samples) // 2]
                shape = f"decode b={b},model={name}"
                print(f"gpt2/model {shape} static+compile: {med:.3f} ms ({time.perf_counter() - t_all:.1f} s with compilation)")
                out.append(dict(family="gpt2", op="model", shape=shape,
                                name="HF static cache + torch.compile reduce-overhead bf16",
                                median_ms=med, min_ms=samples[0], max_ms=samples[-1]))
            except Exception as e:  # noqa: BLE001 - report and keep the other sizes
                print(f"{name} b={b}: not available ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
            torch._dynamo.reset()
        del m
        torch.cuda.empty_cache()
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--family", default="norm,attention,attention-prefill-bf16,attention-decode,quant-int4,matmul-gemv,gpt2")
    p.add_argument("--sizes", default="gpt2-medium,gpt2-large,gpt2-xl", help="gpt2-sizes: which models")
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    anchors = []
    for fam in args.family.split(","):
        anchors += {"norm": norm, "attention": attention, "attention-prefill-bf16": attention_prefill_bf16,
                    "attention-prefill-bf16-fa3": attention_prefill_bf16_fa3,
                    "attention-decode": attention_decode,
                    "quant-int4": quant_int4, "matmul-gemv": matmul_gemv, "matmul-gemv-fp8": matmul_gemv_fp8,
                    "matmul-linear-fp8": matmul_linear_fp8,
                    "gpt2": gpt2,
                    "gpt2-sizes": lambda: gpt2_sizes(args.sizes.split(","))}[fam]()
    dev = torch.cuda.get_device_name(0)
    with open(args.out, "w") as f:
        json.dump({"device": dev, "torch": torch.__version__, "anchors": anchors}, f, indent=1)
    # A plain device-to-device copy in the same session, for comparison with `ladder device`.
    n = 1 << 28
    src, dst = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    med, _, _ = time_fn([lambda: dst.copy_(src)])
    print(f"torch copy: {2 * n * 4 / (med * 1e-3) / 1e9:.0f} GB/s (1 GiB each way)")


if __name__ == "__main__":
    main()
