"""attn_implementation="ck_fmha" vs "sdpa" in a transformers Llama-style model (random weights).

    python benchmarks/transformers_bench.py --out benchmarks/results/transformers.json      # GPU
    TRITON_INTERPRET=1 python benchmarks/transformers_bench.py --tiny                         # CPU smoke

Builds one random-weight LlamaForCausalLM (default: hidden 2048, 16 heads, GQA 4:1, 4 layers, bf16) twice,
same weights, once per attention implementation, and reports

* agreement: logits (relative L2), loss, and weight gradients after one backward (relative L2);
* timings (CUDA events through triton.testing, medians): the model's forward+backward and forward,
  and one layer's attention call alone (forward, forward+backward), eager and replayed as a CUDA
  graph where capture works (a failure is recorded, not fatal);
* greedy generation with the KV cache: tokens per second and whether both produce the same tokens.

``speedup`` = sdpa time / ck_fmha time (> 1: ck_fmha faster).  Everything goes through public APIs:
``ck_fmha.integrations.transformers.register()`` and the model's ``attn_implementation``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

GPU = dict(vocab=32000, hidden=2048, ffn=5632, heads=16, kv_heads=4, layers=4, seq=2048, batch=4,
           dtype="bf16", prompt=128, new_tokens=64, gen_batch=4)
TINY = dict(vocab=97, hidden=64, ffn=96, heads=4, kv_heads=1, layers=2, seq=16, batch=2, dtype="fp16",
            prompt=6, new_tokens=4, gen_batch=2)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def models(cfg: dict, device: str):
    """(sdpa model, ck_fmha model) with identical random weights."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    import ck_fmha.integrations.transformers as ck_tf

    name = ck_tf.register()
    def conf():
        return LlamaConfig(vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], intermediate_size=cfg["ffn"],
                           num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
                           num_key_value_heads=cfg["kv_heads"],
                           max_position_embeddings=cfg["seq"] + cfg["new_tokens"], pad_token_id=0, bos_token_id=1,
                           eos_token_id=None)
    dt = DTYPES[cfg["dtype"]]
    torch.manual_seed(0)
    # one config object each: from_config records the attention implementation in the config it is given
    with torch.device(device):  # initialise on the device: random init of 300M parameters on the host is slow
        ref = AutoModelForCausalLM.from_config(conf(), attn_implementation="sdpa", dtype=dt)
        ck = AutoModelForCausalLM.from_config(conf(), attn_implementation=name, dtype=dt)
    ck.load_state_dict(ref.state_dict())
    assert (ref.config._attn_implementation, ck.config._attn_implementation) == ("sdpa", name)
    return ref, ck


def timer(device: str, budget_ms: float):
    """fn -> median milliseconds (CUDA: triton's do_bench; CPU: wall clock, three calls)."""
    if device == "cuda":
        import triton

        return lambda fn: triton.testing.do_bench(fn, warmup=3, rep=budget_ms, return_mode="median")

    def cpu(fn):
        fn()
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts)
    return cpu


def graph_ms(fn, device: str) -> dict:
    """Eager and CUDA-graph medians through ck_core.bench.eager_and_graph_ms (CUDA only)."""
    if device != "cuda":
        return {}
    from ck_core.bench import eager_and_graph_ms

    try:
        return eager_and_graph_ms(fn)
    except Exception as exc:  # capture can fail for reasons of the model code, not of the kernels
        return {"graph_error": f"{type(exc).__name__}: {str(exc)[:200]}"}


def agreement(ref, ck, ids) -> dict:
    out_r, out_c = ref(ids, labels=ids), ck(ids, labels=ids)
    out_r.loss.backward()
    out_c.loss.backward()
    grads = {}
    for (n, pr), (_, pc) in zip(ref.named_parameters(), ck.named_parameters()):
        if any(s in n for s in ("layers.0.self_attn.q_proj", "layers.0.self_attn.k_proj",
                                "layers.0.self_attn.v_proj", "embed_tokens")):
            grads[n] = rel(pc.grad, pr.grad)
    ref.zero_grad(set_to_none=True)
    ck.zero_grad(set_to_none=True)
    lr, lc = out_r.loss.item(), out_c.loss.item()
    return {"logits_rel_l2": rel(out_c.logits, out_r.logits), "loss_sdpa": lr, "loss_ck_fmha": lc,
            "loss_rel_diff": abs(lc - lr) / abs(lr), "grad_rel_l2": grads}


def model_timings(ref, ck, ids, t, device) -> dict:
    res = {}
    for name, m in (("sdpa", ref), ("ck_fmha", ck)):
        def step(m=m):
            m(ids, labels=ids).loss.backward()
        with torch.no_grad():
            fwd = graph_ms(lambda m=m: m(ids, use_cache=False), device) or {"eager_ms": t(lambda: m(ids))}
        res[name] = {"fwd_bwd_ms": t(step), "fwd_eager_ms": fwd.get("eager_ms"),
                     "fwd_graph_ms": fwd.get("graph_ms"), "fwd_graph_error": fwd.get("graph_error")}
        m.zero_grad(set_to_none=True)
    res["speedup_fwd_bwd"] = res["sdpa"]["fwd_bwd_ms"] / res["ck_fmha"]["fwd_bwd_ms"]
    if res["sdpa"]["fwd_eager_ms"] and res["ck_fmha"]["fwd_eager_ms"]:
        res["speedup_fwd_eager"] = res["sdpa"]["fwd_eager_ms"] / res["ck_fmha"]["fwd_eager_ms"]
    if res["sdpa"]["fwd_graph_ms"] and res["ck_fmha"]["fwd_graph_ms"]:
        res["speedup_fwd_graph"] = res["sdpa"]["fwd_graph_ms"] / res["ck_fmha"]["fwd_graph_ms"]
    return res


def attention_timings(ref, ck, cfg, t, device) -> dict:
    """One layer's attention function as the model calls it: q [B, H, S, D], k/v [B, Hk, S, D], causal."""
    from transformers import AttentionInterface

    b, s, h, hk = cfg["batch"], cfg["seq"], cfg["heads"], cfg["kv_heads"]
    d = cfg["hidden"] // h
    dt = DTYPES[cfg["dtype"]]
    g = torch.Generator(device=device).manual_seed(1)
    q = torch.randn(b, h, s, d, device=device, dtype=dt, generator=g, requires_grad=True)
    k, v = (torch.randn(b, hk, s, d, device=device, dtype=dt, generator=g, requires_grad=True) for _ in range(2))
    do = torch.randn(b, s, h, d, device=device, dtype=dt, generator=g)
    res, outs = {}, {}
    for name, m in (("sdpa", ref), ("ck_fmha", ck)):
        mod = m.model.layers[0].self_attn
        fn = AttentionInterface()[m.config._attn_implementation]

        def fwd(fn=fn, mod=mod):
            return fn(mod, q, k, v, None, scaling=mod.scaling, dropout=0.0, is_causal=True)[0]

        def fwd_bwd(fwd=fwd):
            return torch.autograd.grad(fwd(), (q, k, v), do)

        outs[name] = (fwd().detach(), fwd_bwd())
        with torch.no_grad():
            f = graph_ms(fwd, device) or {"eager_ms": t(fwd)}
        fb = graph_ms(fwd_bwd, device) or {"eager_ms": t(fwd_bwd)}
        res[name] = {"fwd_eager_ms": f.get("eager_ms"), "fwd_graph_ms": f.get("graph_ms"),
                     "fwd_bwd_eager_ms": fb.get("eager_ms"), "fwd_bwd_graph_ms": fb.get("graph_ms"),
                     **({"graph_error": f.get("graph_error") or fb.get("graph_error")}
                        if f.get("graph_error") or fb.get("graph_error") else {})}
    for key in ("fwd_eager_ms", "fwd_graph_ms", "fwd_bwd_eager_ms", "fwd_bwd_graph_ms"):
        a, c = res["sdpa"].get(key), res["ck_fmha"].get(key)
        if a and c:
            res["speedup_" + key.replace("_ms", "")] = a / c
    res["out_rel_l2"] = rel(outs["ck_fmha"][0], outs["sdpa"][0])
    res["grad_rel_l2"] = {n: rel(c, r) for n, c, r in zip("qkv", outs["ck_fmha"][1], outs["sdpa"][1])}
    res["shape"] = dict(b=b, h=h, hk=hk, s=s, d=d, causal=True, dtype=cfg["dtype"])
    return res


def generation(ref, ck, cfg, device) -> dict:
    ids = torch.randint(2, cfg["vocab"], (cfg["gen_batch"], cfg["prompt"]), device=device,
                        generator=torch.Generator(device=device).manual_seed(2))
    res, toks = {}, {}
    for name, m in (("sdpa", ref), ("ck_fmha", ck)):
        kw = dict(max_new_tokens=cfg["new_tokens"], min_new_tokens=cfg["new_tokens"], do_sample=False)
        with torch.no_grad():
            m.generate(ids, **kw)  # warm-up (JIT compiles, allocator)
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = m.generate(ids, **kw)
            if device == "cuda":
                torch.cuda.synchronize()
            secs = time.perf_counter() - t0
        toks[name] = out[:, cfg["prompt"]:]
        res[name] = {"seconds": secs, "tokens_per_s": toks[name].numel() / secs}
    same = (toks["sdpa"] == toks["ck_fmha"])
    res["same_tokens_fraction"] = float(same.float().mean())
    # greedy decoding of random weights has near-ties; the first divergence says more than the count
    first = [int((~row).nonzero()[0]) if (~row).any() else None for row in same]
    res["first_divergence_per_row"] = first
    res["speedup"] = res["ck_fmha"]["tokens_per_s"] / res["sdpa"]["tokens_per_s"]
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="a tiny model (CPU smoke run under TRITON_INTERPRET=1)")
    ap.add_argument("--out", default=None, help="write the JSON here")
    ap.add_argument("--rep-ms", type=float, default=300.0, help="timing budget per measurement (CUDA)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: model,attention,generate")
    for k, v in GPU.items():
        ap.add_argument(f"--{k.replace('_', '-')}", type=type(v), default=None)
    a = ap.parse_args(argv)
    cfg = dict(TINY if a.tiny else GPU)
    cfg.update({k: getattr(a, k) for k in GPU if getattr(a, k) is not None})
    device = "cuda" if torch.cuda.is_available() else "cpu"
    import transformers

    import ck_fmha

    skip = set(filter(None, a.skip.split(",")))
    t = timer(device, a.rep_ms)
    t0 = time.time()
    ref, ck = models(cfg, device)
    ids = torch.randint(2, cfg["vocab"], (cfg["batch"], cfg["seq"]), device=device,
                        generator=torch.Generator(device=device).manual_seed(3))
    res = {"what": "random-weight LlamaForCausalLM, attn_implementation ck_fmha vs sdpa", "config": cfg,
           "device": torch.cuda.get_device_name(0) if device == "cuda" else f"CPU ({platform.machine()})",
           "date": datetime.date.today().isoformat(), "command": " ".join(["python"] + sys.argv),
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "ck_fmha": getattr(ck_fmha, "__version__", "dev")},
           "speedup_is": "sdpa time / ck_fmha time (> 1: ck_fmha faster)"}
    res["agreement"] = agreement(ref, ck, ids)
    print(json.dumps(res["agreement"], indent=1), flush=True)
    parts = (("model", lambda: model_timings(ref, ck, ids, t, device)),
             ("attention", lambda: attention_timings(ref, ck, cfg, t, device)),
             ("generate", lambda: generation(ref, ck, cfg, device)))
    for name, fn in parts:
        if name in skip:
            continue
        try:
            res[name] = fn()
        except Exception as exc:  # keep the other parts' figures
            res[name] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
        print(name, json.dumps(res[name], indent=1, default=str), flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    res["wall_s"] = round(time.time() - t0, 1)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        from ck_core.bench import with_header

        Path(a.out).write_text(json.dumps(with_header(res), indent=1, default=str))
    ok = (res["agreement"]["logits_rel_l2"] < 2e-2 and res["agreement"]["loss_rel_diff"] < 1e-2)
    print("agreement", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
