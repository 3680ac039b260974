"""Real models through the public APIs, ours vs cuDNN / cuBLAS / SDPA in one process (issue #26).

    python benchmarks/models.py --out models.json            # GPU (H200: ~8 min, first run compiles; a process per row)
    python benchmarks/models.py --quick --out models.json    # a ~3 minute subset
    python benchmarks/models.py --tiny --device cpu --out /tmp/models.json   # CPU smoke (Triton interpreter)

Models (random weights, nothing downloaded), eager, bf16:

* ResNet-50 and ConvNeXt-T (torchvision), channels-last, batch 64 (``--batch``): inference and a
  training step (forward + backward + SGD step), every ``nn.Conv2d`` through ``ck_conv.conv2d``
  (``ck_conv.patch``) against the same model on torch's convolutions (cuDNN);
* a Llama-shaped transformers model (LlamaConfig: 8 layers, hidden 2048, 16 heads, 4 KV heads,
  intermediate 5632, vocab 32000): training step and forward (batch 4 x 1024 tokens), greedy
  generation with the KV cache (``model.generate``, batch 8, prompt 128, 64 new tokens), with
  ``attn_implementation="ck_fmha"`` (``ck_fmha.integrations.transformers``) against "sdpa": the
  attention alone (``attn``), and the attention plus every ``nn.Linear`` through ``ck_gemm.linear``
  (``attn+gemm``, ``ck_gemm.patch``) against cuBLAS.

Both sides start from the same weights (restored before every row) and run on the same inputs.
Per row: ``ours_ms`` / ``peer_ms`` (median of CUDA-event timings, eager), ``ratio`` = peer / ours
(> 1: ours faster), the very first call of each side (compilation included: ``*_first_ms``), a
CUDA-graph-captured training step where capture works (``*_graph_ms``), and a correctness check of
ours against the peer on the first call: logits (relative L2) or loss (relative difference) within
a stated tolerance; for generation, both models decode the peer's generated tokens with their KV
caches (teacher forcing, a growing 2D all-ones mask as generate passes) and their per-step logits
are compared (relative L2); the fraction of equal greedy tokens is reported as ``tokens_equal``
(greedy decoding of random weights has near-ties, so it is not required).  A failing row gets ``status: "error: ..."``; the
others still run.  Output: JSON (``{"name": "ck.models", "version": 1, ...}``) to ``--out`` and a
markdown table on stdout.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a fresh clone runs without installing: the core, op and arch plugins from this checkout
for _p in [ROOT, *sorted(ROOT.glob("plugins/*")), *sorted(ROOT.glob("archs/*"))]:
    if _p.is_dir() and str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

GPU = dict(batch=64, image=224, llama_batch=4, seq=1024, gen_batch=8, prompt=128, new_tokens=64,
           layers=8, hidden=2048, heads=16, kv_heads=4, ffn=5632, vocab=32000, iters=20, gen_iters=7)
TINY = dict(batch=2, image=16, llama_batch=2, seq=16, gen_batch=2, prompt=6, new_tokens=4,
            layers=2, hidden=64, heads=4, kv_heads=1, ffn=96, vocab=97, iters=2, gen_iters=1)
#: tolerances of the correctness checks (bf16 end to end; relative)
TOL = {"logits": 5e-2, "loss": 2e-2, "decode logits": 5e-2}
ROWS = ("resnet50:infer", "resnet50:train", "convnext_t:infer", "convnext_t:train",
        "llama:train:attn", "llama:forward:attn", "llama:generate:attn",
        "llama:train:attn+gemm", "llama:forward:attn+gemm", "llama:generate:attn+gemm")
QUICK = ("resnet50:infer", "resnet50:train", "llama:train:attn", "llama:forward:attn", "llama:forward:attn+gemm")


class Timer:
    """Milliseconds of calls on ``device``: CUDA events around each call (median), or wall clock."""

    def __init__(self, device: str, budget_s: float):
        self.device, self.budget_s = device, budget_s

    def sync(self):
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()

    def once(self, fn):
        """(result, ms) of one call, synchronised (the first call: compilation included)."""
        self.sync()
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        return out, (time.perf_counter() - t0) * 1e3

    def median(self, fn, iters: int) -> float:
        import torch

        _, ms = self.once(fn)   # warm-up (and a guess of how many calls the budget holds)
        n = max(1, min(iters, int(self.budget_s * 1e3 / max(ms, 1e-3))))
        times = []
        for _ in range(n):
            if self.device == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            else:
                times.append(self.once(fn)[1])
        return statistics.median(times)

    def graph(self, fn, iters: int):
        """(ms, None) of ``fn`` captured into a CUDA graph and replayed, or (None, why)."""
        import torch

        if self.device != "cuda":
            return None, "no CUDA graphs off the GPU"
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):   # warm-up off the capture stream, as torch's docs do it
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            # autograd's AccumulateGrad nodes keep the stream of the eager steps that made them (the legacy
            # default stream): a capture of a backward then fails inside the engine (cudaErrorStreamCapture-
            # Implicit, pytorch#164302) unless torch redirects such stale streams to the capturing one
            override = getattr(torch.autograd.graph, "set_override_stale_capture_stream", None)
            if override is not None:
                override(True)
            try:
                with torch.cuda.graph(g):
                    fn()
            finally:
                if override is not None:
                    override(False)
            return self.median(g.replay, iters), None
        except Exception as exc:  # noqa: BLE001 - a side that cannot be captured keeps its eager time
            return None, f"{type(exc).__name__}: {str(exc)[:200]}"


def rel(a, b) -> float:
    a, b = a.detach().double().flatten(), b.detach().double().flatten()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# -- models --------------------------------------------------------------------------------------

def tiny_cnn():
    """A small CNN with what the torchvision models use (stride, groups, BN, a 1x1, a head), for CPU
    smoke runs and machines without torchvision."""
    import torch.nn as nn

    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=2), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 16, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def cnn(name: str, cfg: dict, device: str, dtype):
    import torch

    if cfg.get("tiny"):
        m, classes = tiny_cnn(), 10
    else:
        import torchvision

        make = {"resnet50": torchvision.models.resnet50, "convnext_t": torchvision.models.convnext_tiny}[name]
        m = make(weights=None)
        classes = 1000
    torch.manual_seed(0)
    m = m.to(device=device, dtype=dtype, memory_format=torch.channels_last)
    g = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(cfg["batch"], 3, cfg["image"], cfg["image"], device=device, generator=g).to(dtype)
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, classes, (cfg["batch"],), device=device, generator=g)
    return m, x, y


def llama(cfg: dict, device: str, dtype):
    """(sdpa model, ck_fmha model) with the same random weights."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    import ck_fmha.integrations.transformers as ck_tf

    name = ck_tf.register()

    def conf():
        return LlamaConfig(vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], intermediate_size=cfg["ffn"],
                           num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
                           num_key_value_heads=cfg["kv_heads"],
                           max_position_embeddings=max(cfg["seq"], cfg["prompt"] + cfg["new_tokens"]),
                           pad_token_id=0, bos_token_id=1, eos_token_id=None)
    torch.manual_seed(0)
    with torch.device(device):
        peer = AutoModelForCausalLM.from_config(conf(), attn_implementation="sdpa", dtype=dtype)
        ours = AutoModelForCausalLM.from_config(conf(), attn_implementation=name, dtype=dtype)
    ours.load_state_dict(peer.state_dict())
    return peer, ours


# -- one row ---------------------------------------------------------------------------------------

def measure(t: Timer, step, iters: int, graph_step=None) -> dict:
    """First call (with its result), eager median, and a CUDA-graph median of ``graph_step``."""
    out, first = t.once(step)
    res = {"out": out, "first_ms": first, "ms": t.median(step, iters)}
    if graph_step is not None:
        res["graph_ms"], res["graph_error"] = t.graph(graph_step, iters)
    return res


def train_step(model, opt, loss_of):
    def step():
        opt.zero_grad(set_to_none=False)
        loss = loss_of(model)
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def row_cnn(name: str, mode: str, cfg: dict, t: Timer, device: str, dtype) -> dict:
    import torch
    import torch.nn.functional as F

    import ck_conv

    peer, x, y = cnn(name, cfg, device, dtype)
    ours = copy.deepcopy(peer)
    n = ck_conv.patch(ours)
    sides = {}
    for side, m in (("peer", peer), ("ours", ours)):
        if mode == "infer":
            m.eval()

            def step(m=m):
                with torch.no_grad():
                    return m(x)
            sides[side] = measure(t, step, cfg["iters"])
        else:
            m.train()
            opt = torch.optim.SGD(m.parameters(), lr=1e-4)
            step = train_step(m, opt, lambda m: F.cross_entropy(m(x).float(), y))
            sides[side] = measure(t, step, cfg["iters"], graph_step=step)
        if device == "cuda":
            torch.cuda.empty_cache()
    metric = "logits" if mode == "infer" else "loss"
    value = rel(sides["ours"]["out"], sides["peer"]["out"])
    return _row(sides, metric, value, value <= TOL[metric], patched_conv2d=n)


def row_llama(mode: str, variant: str, models, cfg: dict, t: Timer, device: str) -> dict:
    import torch

    import ck_gemm

    peer, ours, state = models
    peer.load_state_dict(state)   # every row starts from the same weights
    ours.load_state_dict(state)
    n = ck_gemm.patch(ours) if variant == "attn+gemm" else 0
    g = torch.Generator(device=device).manual_seed(3)
    ids = torch.randint(2, cfg["vocab"], (cfg["llama_batch"], cfg["seq"]), device=device, generator=g)
    prompt = torch.randint(2, cfg["vocab"], (cfg["gen_batch"], cfg["prompt"]), device=device, generator=g)
    sides = {}
    try:
        for side, m in (("peer", peer), ("ours", ours)):
            if mode == "train":
                m.train()
                opt = torch.optim.SGD(m.parameters(), lr=1e-4)
                step = train_step(m, opt, lambda m: m(ids, labels=ids, use_cache=False).loss)
                sides[side] = measure(t, step, cfg["iters"], graph_step=step)
            elif mode == "forward":
                m.eval()

                def step(m=m):
                    with torch.no_grad():
                        return m(ids, use_cache=False).logits
                sides[side] = measure(t, step, cfg["iters"])
            else:
                m.eval()
                kw = dict(max_new_tokens=cfg["new_tokens"], min_new_tokens=cfg["new_tokens"], do_sample=False)

                def step(m=m):
                    with torch.no_grad():
                        return m.generate(prompt, **kw)[:, cfg["prompt"]:]
                sides[side] = measure(t, step, cfg["gen_iters"])
                # the check: both models decode the peer's tokens with their KV caches (teacher forcing), and
                # their per-step logits are compared: greedy tokens of random weights diverge at near-ties
                peer_seq = torch.cat([prompt, sides["peer"]["out"]], 1)
                sides[side]["decode_logits"] = _decode_logits(m, peer_seq, cfg["prompt"])
            if device == "cuda":
                torch.cuda.empty_cache()
    finally:
        ck_gemm.unpatch(ours)
    if mode == "generate":
        same = float((sides["ours"]["out"] == sides["peer"]["out"]).float().mean())
        value = rel(sides["ours"]["decode_logits"], sides["peer"]["decode_logits"])
        return _row(sides, "decode logits", value, value <= TOL["decode logits"], patched_linear=n,
                    tokens_equal=same)
    metric = "loss" if mode == "train" else "logits"
    value = rel(sides["ours"]["out"], sides["peer"]["out"])
    return _row(sides, metric, value, value <= TOL[metric], patched_linear=n)


def _decode_logits(m, seq, prompt_len: int):
    """Per-step logits of ``m`` decoding ``seq`` after its prompt with the KV cache, as generate does
    (a 2D all-ones attention mask growing by one each step): [batch, steps, vocab], float32."""
    import torch

    with torch.no_grad():
        mask = torch.ones_like(seq)
        out = m(seq[:, :prompt_len], attention_mask=mask[:, :prompt_len], use_cache=True)
        past, steps = out.past_key_values, [out.logits[:, -1].float()]
        for i in range(prompt_len, seq.shape[1] - 1):
            out = m(seq[:, i:i + 1], attention_mask=mask[:, :i + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values
            steps.append(out.logits[:, -1].float())
    return torch.stack(steps, 1)


def _row(sides: dict, metric: str, value: float, ok: bool, **extra) -> dict:
    o, p = sides["ours"], sides["peer"]
    row = {"ours_ms": o["ms"], "peer_ms": p["ms"], "ratio": p["ms"] / o["ms"] if o["ms"] else None,
           "ours_first_ms": o["first_ms"], "peer_first_ms": p["first_ms"],
           "check": {"metric": metric, "value": value,
                     "tol": f"<= {TOL[metric]}", "ok": bool(ok)},
           **extra}
    if "graph_ms" in o or "graph_ms" in p:
        row.update(ours_graph_ms=o.get("graph_ms"), peer_graph_ms=p.get("graph_ms"))
        if o.get("graph_ms") and p.get("graph_ms"):
            row["graph_ratio"] = p["graph_ms"] / o["graph_ms"]
        errs = {s: sides[s]["graph_error"] for s in sides if sides[s].get("graph_error")}
        if errs:
            row["graph_error"] = errs
    return row


# -- the run ---------------------------------------------------------------------------------------

def _versions() -> dict:
    import importlib

    out = {"python": platform.python_version()}
    for mod in ("torch", "triton", "torchvision", "transformers"):
        try:
            out[mod] = importlib.import_module(mod).__version__
        except Exception:  # noqa: BLE001 - not installed
            out[mod] = None
    return out


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except Exception:  # noqa: BLE001 - no git
        return "unknown"


def _fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def markdown(rows: list) -> str:
    head = ("| model | mode | ours | ours ms | peer | peer ms | ratio | first ms ours / peer | graph ms ours / peer "
            "| check | status |\n|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        c = r.get("check") or {}
        check = f"{'ok' if c.get('ok') else 'NO'} {c.get('metric')} {_fmt(c.get('value'), '.2e')}" if c else "-"
        lines.append(f"| {r['model']} | {r['mode']} | {r.get('ours', '-')} | {_fmt(r.get('ours_ms'))} | {r.get('peer', '-')} | "
                     f"{_fmt(r.get('peer_ms'))} | {_fmt(r.get('ratio'))} | {_fmt(r.get('ours_first_ms'), '.0f')} / "
                     f"{_fmt(r.get('peer_first_ms'), '.0f')} | {_fmt(r.get('ours_graph_ms'))} / "
                     f"{_fmt(r.get('peer_graph_ms'))} | {check} | {r['status'][:60]} |")
    return "\n".join(lines)


def _isolated(spec: str, argv: list, left_s: float) -> dict:
    """Row ``spec`` run by a child process of this script (same options), its row read back; a child
    that crashes or outlives the time left gives an error row."""
    import tempfile

    model, mode, *variant = spec.split(":")
    if left_s <= 0:
        return {"model": model, "mode": mode, "status": "skipped: time budget spent", "wall_s": 0.0}
    drop = {"--out", "--rows", "--isolate", "--spec", "--budget-s"}
    args, skip = [], False
    for x in argv:
        if skip:
            skip = False
            continue
        if x.split("=", 1)[0] in drop:
            skip = "=" not in x
            continue
        args.append(x)
    r0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "row.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), *args, "--spec", spec, "--isolate", "no",
               "--out", str(out)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(30.0, left_s + 60.0))
        except subprocess.TimeoutExpired:
            return {"model": model, "mode": mode, "status": "error: the row's process ran out of time",
                    "wall_s": round(time.time() - r0, 1)}
        if proc.returncode or not out.exists():
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or ["no output"]
            return {"model": model, "mode": mode, "status": f"error: the row's process exited {proc.returncode}: "
                    f"{tail[0][:200]}", "wall_s": round(time.time() - r0, 1)}
        row = json.loads(out.read_text())["rows"][0]
    row["wall_s"] = round(time.time() - r0, 1)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the JSON here")
    ap.add_argument("--quick", action="store_true", help=f"the ~3 minute subset: {', '.join(QUICK)}")
    ap.add_argument("--tiny", action="store_true", help="tiny models (CPU smoke runs; a local CNN for both CNN rows)")
    ap.add_argument("--device", default=None, help="cuda (default when present) or cpu (Triton's interpreter)")
    ap.add_argument("--rows", default="", help="comma list of rows to run (substrings of " + ", ".join(ROWS) + ")")
    ap.add_argument("--budget-s", type=float, default=450.0,
                    help="rows that would start after this many seconds are skipped (status says so)")
    ap.add_argument("--rep-s", type=float, default=3.0, help="timing budget per measurement, seconds")
    ap.add_argument("--isolate", choices=("auto", "yes", "no"), default="auto",
                    help="run each row in its own process (auto: on the GPU), so a row that leaves the CUDA "
                         "context in a bad state (an aborted graph capture, an illegal access) cannot fail "
                         "the rows after it")
    ap.add_argument("--spec", default=None, help=argparse.SUPPRESS)   # one exact row (an isolated child)
    for k, v in GPU.items():
        ap.add_argument(f"--{k.replace('_', '-')}", type=int, default=None, help=f"default {v} (tiny: {TINY[k]})")
    a = ap.parse_args(argv)
    cfg = dict(TINY if a.tiny else GPU, tiny=a.tiny)
    cfg.update({k: getattr(a, k) for k in GPU if getattr(a, k) is not None})
    if a.device == "cpu" or a.device is None and os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        os.environ.setdefault("TRITON_INTERPRET", "1")   # before anything imports a Triton kernel
    import torch

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    # bf16 on the GPU; on the CPU the interpreter runs fp32 convolutions and fp16 attention/GEMMs
    cnn_dtype = torch.bfloat16 if device == "cuda" else torch.float32
    llm_dtype = torch.bfloat16 if device == "cuda" else torch.float16
    wanted = [r for r in (QUICK if a.quick else ROWS) if not a.rows or any(s in r for s in a.rows.split(","))]
    if a.spec:
        wanted = [a.spec]
    t = Timer(device, a.rep_s)
    t0 = time.time()
    rows, llm = [], None
    isolate = a.spec is None and (a.isolate == "yes" or (a.isolate == "auto" and device == "cuda"))
    for spec in wanted if isolate else ():
        row = _isolated(spec, argv if argv is not None else sys.argv[1:], a.budget_s - (time.time() - t0))
        rows.append(row)
        print(f"{spec}: {str(row.get('status'))[:120]} ({row.get('wall_s')} s)", file=sys.stderr, flush=True)
    for spec in () if isolate else wanted:
        model, mode, *variant = spec.split(":")
        variant = variant[0] if variant else "conv"
        row = {"model": model if not (a.tiny and model != "llama") else f"{model} (tiny local CNN)",
               "mode": mode, "batch": cfg["batch"] if model != "llama" else
               (cfg["gen_batch"] if mode == "generate" else cfg["llama_batch"]),
               "ours": {"conv": "ck_conv.patch", "attn": "ck_fmha", "attn+gemm": "ck_fmha + ck_gemm.patch"}[variant],
               "peer": {"conv": "cuDNN" if device == "cuda" else "torch", "attn": "sdpa",
                        "attn+gemm": "sdpa + cuBLAS" if device == "cuda" else "sdpa + torch"}[variant],
               "dtype": str(llm_dtype if model == "llama" else cnn_dtype).replace("torch.", "")}
        if model == "llama":
            row.update(seq=cfg["prompt"] if mode == "generate" else cfg["seq"],
                       **({"new_tokens": cfg["new_tokens"]} if mode == "generate" else {}))
        if time.time() - t0 > a.budget_s:
            row["status"] = f"skipped: time budget ({a.budget_s:.0f} s) spent"
            rows.append(row)
            continue
        r0 = time.time()
        try:
            if model == "llama":
                if llm is None:
                    peer, ours = llama(cfg, device, llm_dtype)
                    llm = (peer, ours, {k: v.clone() for k, v in peer.state_dict().items()})
                row.update(row_llama(mode, variant, llm, cfg, t, device))
            else:
                row.update(row_cnn(model, mode, cfg, t, device, cnn_dtype))
            row["status"] = "ok"
        except Exception as exc:  # noqa: BLE001 - one failing row never stops the others
            row["status"] = f"error: {type(exc).__name__}: {str(exc)[:300]}"
            row["traceback"] = traceback.format_exc()[-2000:]
        row["wall_s"] = round(time.time() - r0, 1)
        rows.append(row)
        print(f"{spec}: {row['status'][:120]} ({row['wall_s']} s)", file=sys.stderr, flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    res = {"name": "ck.models", "version": 1,
           "device": torch.cuda.get_device_name(0) if device == "cuda" else f"CPU ({platform.machine()})",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join(["python"] + sys.argv), "commit": _commit(), "versions": _versions(),
           "config": cfg, "tolerances": TOL, "ratio_is": "peer ms / ours ms (> 1: ours faster)",
           "wall_s": round(time.time() - t0, 1), "rows": rows}
    from ck_core.bench import with_header   # the results header (schema, device, date, command, commit)

    res.pop("commit", None)
    res = with_header(res, res.get("command"), res.get("device"))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1, default=str))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
