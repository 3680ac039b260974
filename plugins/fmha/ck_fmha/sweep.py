"""The FMHA part of ``ck sweep fmha``: the tile engine's columns, configs and filters, SDPA peer.

CSV columns follow CK's FMHA tile engine (``problem_name, batch, seqlen_q, seqlen_k, nhead_q,
nhead_k, hdim_q, hdim_v, dtype, kernel, family, mode, pipeline, tile_m0 ...``).  Seed-format
configs apply to CK-rule keys exactly as ``ck list --config`` applies them (the config's
receipt may be a number or CK's name, e.g. ``ck_default``); on Triton keys the same
allow-lists apply to the fields those keys have.  Filters see the seed's spellings too
(``c.data_type``, ``c.tile_m0``, ``c.pad_s`` ...).
"""
from __future__ import annotations

from importlib.resources import files
from itertools import accumulate

from ck_core.sweep import cast_inputs, KernelSet, SweepSpec

from .codegen import ck_facts as F
from .codegen.spec import FmhaKernelSpec
from .codegen.sweep import parse_sweep
from .problem import FmhaProblem

PROBLEM_FIELDS = ("batch", "seqlen_q", "seqlen_k", "nhead_q", "nhead_k", "hdim_q", "hdim_v", "dtype",
                  "problem_mode", "problem_mask")
TILES = ("tile_m0", "tile_n0", "tile_k0", "tile_n1", "tile_k1", "tile_k0max")
KERNEL_FIELDS = ("family", "mode", "pipeline", *TILES, "num_warps", "num_stages", "pad_s", "pad_sk",
                 "pad_d", "pad_dv", "mask", "bias", "lse", "dropout", "logits", "sink")
_RECEIPT_NUMBERS = {name: num for num, name in F.RECEIPTS.items()}
_CK_ALIASES = {"data_type": "dtype", "pad_s": "spad", "pad_sk": "skpad", "pad_d": "dpad", "pad_dv": "dvpad",
               "paged_kv": "pagedkv", "skip_min_seqlen_q": "skip"}


def seed_fields(key) -> dict:
    """``key.fields`` plus the tile engine's names for them."""
    out = dict(key.fields)
    s = key.signature
    if isinstance(s, FmhaKernelSpec):
        for seed, ours in _CK_ALIASES.items():
            if ours in out:
                out[seed] = out[ours]
        for i, t in enumerate(TILES):
            out[t] = s.tile[i] if len(s.tile) > i else None
    else:
        a = key.algorithm
        out.update(data_type=s.dtype, pipeline=a.variant, tile_m0=a.block_m, tile_n0=a.block_n)
    return out


def kernel_columns(key) -> dict:
    f = seed_fields(key)
    row = {c: f.get(c) for c in KERNEL_FIELDS if f.get(c) is not None}
    if not isinstance(key.signature, FmhaKernelSpec):
        row.update(num_warps=key.algorithm.num_warps, num_stages=key.algorithm.num_stages)
    return row


def problem_columns(p: FmhaProblem) -> dict:
    return {"batch": p.batch, "seqlen_q": p.seqlen_q, "seqlen_k": p.seqlen_k, "nhead_q": p.nhead_q,
            "nhead_k": p.nhead_k, "hdim_q": p.hdim_q, "hdim_v": p.hdim_v, "dtype": p.dtype,
            "problem_mode": p.mode, "problem_mask": p.mask}


def make_problem(fields: dict) -> FmhaProblem:
    """Matrix rows may give ragged lengths as ``seqlens_q`` / ``seqlens_kv`` (group mode)."""
    f = dict(fields)
    for name, start in (("seqlens_q", "seqstart_q"), ("seqlens_kv", "seqstart_k")):
        if name in f:
            lens = f.pop(name)
            f[start] = [0, *accumulate(lens)]
            f.setdefault("mode", "group")
            f.setdefault("batch", len(lens))
    return FmhaProblem.from_dict(f)


def kernel_config(data: dict, source: str) -> KernelSet:
    data = dict(data)
    if isinstance(data.get("receipt"), str) and data["receipt"] in _RECEIPT_NUMBERS:
        data["receipt"] = _RECEIPT_NUMBERS[data["receipt"]]
    cfg = parse_sweep(data, source)
    traits = [(k, allowed) for k, allowed in cfg.traits]

    def accept(key) -> bool:
        if isinstance(key.signature, FmhaKernelSpec):
            return cfg.matches(key.signature)
        f = key.fields
        return f["family"] in cfg.families and all(f[k] in allowed for k, allowed in traits if k in f)

    opts = {"families": list(cfg.families)}
    if cfg.receipt is not None:
        opts["receipt"] = cfg.receipt
    return KernelSet(arch=cfg.arch, options=opts, accept=accept)


def _sdpa_ok(p: FmhaProblem, tensors) -> bool:
    q = tensors.get("q")
    return (p.family == "fwd" and p.mode == "batch" and p.layout == "bhsd" and p.dtype in ("fp16", "bf16")
            and p.bias == "none" and p.p_drop == 0 and p.logits_soft_cap == 0 and not p.sink_tokens
            and not p.sink_logits and not p.seqlens_k and p.vlayout == "r"
            and (p.mask == "none" or (p.is_causal and p.seqlen_q == p.seqlen_k))
            and getattr(getattr(q, "device", None), "type", None) == "cuda")


def _sdpa(p: FmhaProblem, q, k, v):
    import torch.nn.functional as Fn

    return Fn.scaled_dot_product_attention(q, k, v, is_causal=p.mask != "none", scale=p.softmax_scale,
                                           enable_gqa=p.nhead_q != p.nhead_k)


def peer(p: FmhaProblem, tensors):
    """torch SDPA (its fastest backend) on the same q/k/v: batch-mode forward, no bias/dropout."""
    if not _sdpa_ok(p, tensors):
        return None
    q, k, v = tensors["q"], tensors["k"], tensors["v"]
    return "torch sdpa", lambda: _sdpa(p, q, k, v)


def device_reference(p: FmhaProblem, tensors):
    """o in fp32 on the GPU (SDPA over fp32 copies) for shapes past the float64 check."""
    if not _sdpa_ok(p, tensors):
        return {}
    o = _sdpa(p, *(tensors[n].float() for n in ("q", "k", "v")))
    return {"o": o}


def device_inputs(problem, tensors):
    return cast_inputs(("q", "k", "v", "knew", "vnew", "k_cache", "v_cache"), problem.dtype, tensors)


def sweep_spec() -> SweepSpec:
    return SweepSpec(op="fmha", shapes=str(files("ck_fmha") / "sweep_shapes.toml"),
                     problem_fields=PROBLEM_FIELDS, kernel_fields=KERNEL_FIELDS,
                     problem_columns=problem_columns, kernel_columns=kernel_columns, make_problem=make_problem,
                     kernel_config=kernel_config, filter_fields=seed_fields, peer=peer,
                     device_reference=device_reference,
                     device_inputs=device_inputs)
