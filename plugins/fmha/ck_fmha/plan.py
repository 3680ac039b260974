"""FMHA stages on named tensors: plans, inputs, references, the numpy backend.

Every stage reads and writes a shared dict of named tensors, so a plan is a
dataflow: split-KV's main stage writes ``o_acc``/``lse_acc`` and the combine
stage reads them; the backward's ``dot_do_o`` writes ``d``, ``dq_dk_dv``
writes ``dq_acc``/``dk``/``dv`` and ``convert_dq`` turns ``dq_acc`` into ``dq``.
"""
from __future__ import annotations

import math

import attrs
import numpy as np

from ck_core.dtypes import numpy_storage, quantize
from ck_core.errors import InvalidProblem

from . import reference as R
from .paged import pack_paged_kv
from .problem import FmhaProblem, combine_problem, expected_shapes

#: the op's tensor vocabulary: what a user passes in, what a plan returns, and what its stages hand on
INPUTS = ("q", "k", "v", "bias", "alibi_slopes", "sink", "o", "lse", "do", "k_cache", "v_cache",
          "block_table", "kv_indptr", "kv_page_indices", "kv_last_page_lens", "knew", "vnew",
          "rotary_cos", "rotary_sin", "seqlens_k", "cu_seqlens_q", "cu_seqlens_k")
OUTPUTS = ("o", "lse", "randval", "dq", "dk", "dv", "dbias", "q_rot", "k_cache", "v_cache")
_NAMES = frozenset((*INPUTS, *OUTPUTS, "o_acc", "lse_acc", "d", "dq_acc"))
#: feature tensors and the problem field that must ask for them
_FEATURE_OF = {"bias": ("bias", "elementwise"), "alibi_slopes": ("bias", "alibi"), "sink": ("sink_logits", True)}


def check_tensor_names(problem: FmhaProblem, tensors) -> None:
    """Refuse a tensor that nothing would read: an unknown name (a typo such as ``bais``), or a
    feature tensor (bias, alibi_slopes, sink) the problem does not ask for.  Silently ignoring
    either would compute something else than the caller meant."""
    if not _NAMES.issuperset(tensors):
        bad = sorted(set(tensors) - _NAMES)
        raise InvalidProblem(f"unknown fmha tensor(s) {bad}; the inputs are {', '.join(INPUTS)}")
    for name, (field, want) in _FEATURE_OF.items():
        if name in tensors and tensors[name] is not None and getattr(problem, field) != want:
            raise InvalidProblem(f"tensor {name!r} given but the problem has {field}={getattr(problem, field)!r}; "
                                 f"set {field}={want!r} or drop {name!r}")


#: tensors a family may read besides q/k/v (passed through when present)
_EXTRAS = ("bias", "alibi_slopes", "sink")
_TABLES = ("block_table", "kv_indptr", "kv_page_indices", "kv_last_page_lens")
BWD = ("bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq")


def plan(problem: FmhaProblem) -> list:
    """Stages of a problem: split-KV = main + combine (one split: the main stage alone, writing
    o and lse itself: one launch); backward = three stages."""
    fam = problem.family
    if fam == "fwd_splitkv":
        if problem.num_splits == 1:
            return [("fwd_splitkv", problem)]
        return [("fwd_splitkv", problem), ("fwd_splitkv_combine", combine_problem(problem))]
    if fam == "bwd_dq_dk_dv":
        return [("bwd_dot_do_o", attrs.evolve(problem, family="bwd_dot_do_o")),
                ("bwd_dq_dk_dv", problem),
                ("bwd_convert_dq", attrs.evolve(problem, family="bwd_convert_dq"))]
    return [(fam, problem)]


def _pick(tensors: dict, names) -> dict:
    return {n: tensors[n] for n in names if n in tensors and tensors[n] is not None}


def _store(p: FmhaProblem, x):
    """Round an output to the problem dtype's storage, as a kernel writes it."""
    dt = "bf16" if p.dtype.startswith("fp8") else p.dtype   # fp8 kernels write bf16 (CK fp8bf16, FA3)
    return quantize(np.asarray(x), dt)


def host_lengths(p: FmhaProblem, tensors: dict) -> FmhaProblem:
    """``p`` with run-time key lengths (tensor ``seqlens_k``) and group-mode offsets (tensors
    ``cu_seqlens_q``/``cu_seqlens_k``) made problem fields: the references and the numpy backend
    read host data anyway, and this validates them (rules R14, R18, R21)."""
    host = lambda name: tuple(int(x) for x in np.asarray(tensors[name]).reshape(-1))   # noqa: E731
    fields: dict = {}
    if p.runtime_seqlens_k:
        if tensors.get("seqlens_k") is None:
            raise InvalidProblem("a problem with run-time key lengths needs the tensor 'seqlens_k'")
        fields.update(runtime_seqlens_k=False, seqlens_k=host("seqlens_k"))
    if p.runtime_seqstarts:
        for name in ("cu_seqlens_q",) + (() if p.paged_kv else ("cu_seqlens_k",)):
            if tensors.get(name) is None:
                raise InvalidProblem(f"a group-mode problem with run-time offsets needs the tensor {name!r}")
        if not p.paged_kv:
            fields["seqstart_k"] = host("cu_seqlens_k")
        fields.update(runtime_seqstarts=False, packed_q=0, packed_k=0, seqstart_q=host("cu_seqlens_q"))
    # one evolve: both fields change together (a half-converted problem breaks rule R14)
    return attrs.evolve(p, **fields) if fields else p


def run_stage(problem: FmhaProblem, tensors: dict) -> dict:
    """One stage on the numpy backend: the reference, outputs rounded like a kernel's."""
    p, t, fam = host_lengths(problem, tensors), tensors, problem.family
    ex = _pick(t, _EXTRAS)
    if fam == "fwd":
        r = R.fwd(p, t["q"], t["k"], t["v"], **ex)
        return _fwd_out(p, r)
    if fam == "fwd_splitkv":
        kv = (t["k_cache"], t["v_cache"]) if p.paged_kv else (t["k"], t["v"])
        r = R.fwd_splitkv(p, t["q"], *kv, **ex, **_pick(t, _TABLES))
        o_acc, lse_acc = np.asarray(r.o_acc, np.float32), np.asarray(r.lse_acc, np.float32)
        if p.num_splits == 1:   # the one-stage plan: this stage writes o and lse (see plan())
            return _fwd_out(p, R.fwd_splitkv_combine(combine_problem(p), o_acc, lse_acc))
        return {"o_acc": o_acc, "lse_acc": lse_acc}
    if fam == "fwd_splitkv_combine":
        return _fwd_out(p, R.fwd_splitkv_combine(p, t["o_acc"], t["lse_acc"]))
    if fam == "fwd_pagedkv":
        return _fwd_out(p, R.fwd_pagedkv(p, t["q"], t["k_cache"], t["v_cache"], **ex, **_pick(t, _TABLES)))
    if fam == "batch_prefill":
        return _fwd_out(p, R.batch_prefill(p, t["q"], t["k_cache"], t["v_cache"], **ex, **_pick(t, _TABLES)))
    if fam == "fwd_appendkv":
        r = R.fwd_appendkv(p, t["q"], t["knew"], t["vnew"], t["k_cache"], t["v_cache"],
                           **_pick(t, ("rotary_cos", "rotary_sin", "block_table")))
        return {"q_rot": _store(p, r.q), "k_cache": _store(p, r.k_cache), "v_cache": _store(p, r.v_cache)}
    if fam == "bwd_dot_do_o":
        return {"d": np.asarray(R.bwd_dot_do_o(p, t["o"], t["do"]), np.float32)}
    if fam == "bwd_dq_dk_dv":
        r = R.bwd_dq_dk_dv(p, t["q"], t["k"], t["v"], t["lse"], t["do"], t["d"],
                           **_pick(t, ("bias", "alibi_slopes")))
        out = {"dq_acc": np.asarray(r.dq, np.float32), "dk": _store(p, r.dk), "dv": _store(p, r.dv)}
        if r.dbias is not None and p.dbias:
            out["dbias"] = _store(p, r.dbias)
        return out
    if fam == "bwd_convert_dq":
        return {"dq": _store(p, R.bwd_convert_dq(p, t["dq_acc"]))}
    raise InvalidProblem(f"unknown FMHA family {fam!r}")


def _fwd_out(p, r) -> dict:
    out = {"o": _store(p, r.o), "lse": np.asarray(r.lse, np.float32)}
    if getattr(r, "randval", None) is not None:
        out["randval"] = r.randval
    return out


def reference(problem: FmhaProblem, tensors: dict) -> dict:
    """Float64 one-shot results: what the whole plan must compute."""
    p, t = host_lengths(problem, tensors), tensors
    ex = _pick(t, _EXTRAS)
    if p.family in BWD:
        d = R.bwd_dot_do_o(p, t["o"], t["do"])
        r = R.bwd_dq_dk_dv(p, t["q"], t["k"], t["v"], t["lse"], t["do"], d,
                           **_pick(t, ("bias", "alibi_slopes")))
        dq = np.asarray(r.dq, np.float64).sum(axis=0)   # unrounded: the sum of the dq_acc slices
        out = {"dq": dq, "dk": np.asarray(r.dk, np.float64), "dv": np.asarray(r.dv, np.float64)}
        if r.dbias is not None and p.dbias:   # dbias is an output only where the problem asks for it
            out["dbias"] = r.dbias
        return out
    if p.family == "fwd_appendkv":
        r = R.fwd_appendkv(p, t["q"], t["knew"], t["vnew"], t["k_cache"], t["v_cache"],
                           **_pick(t, ("rotary_cos", "rotary_sin", "block_table")))
        return {"q_rot": r.q, "k_cache": r.k_cache, "v_cache": r.v_cache}
    if p.family in ("fwd_pagedkv", "batch_prefill") or (p.family.startswith("fwd_splitkv") and p.paged_kv):
        r = R.attention_forward(p, t["q"], t["k_cache"], t["v_cache"], **ex, **_pick(t, _TABLES))
    else:
        r = R.attention_forward(p, t["q"], t["k"], t["v"], **ex)
    return {"o": r.o, "lse": r.lse}


def _rand(rng, shape, dtype):
    x = rng.standard_normal(shape)
    x[x == 0] = 1e-3
    return quantize(x, dtype) if dtype in ("fp8", "bf16") else x.astype(numpy_storage(dtype))


def make_inputs(problem: FmhaProblem, rng: np.random.Generator) -> dict:
    """Fresh random inputs for the problem's family (never zeros)."""
    p = problem
    dt = p.dtype
    sh = expected_shapes(p)
    t: dict = {"q": _rand(rng, sh["q"], dt)}
    if p.bias == "elementwise":
        t["bias"] = _rand(rng, sh["bias"][0], dt)
    if p.bias == "alibi":
        t["alibi_slopes"] = rng.uniform(0.05, 0.9, (p.nhead_q,)).astype(np.float32)
    if p.sink_logits:
        t["sink"] = rng.uniform(-1, 3, (p.nhead_q,)).astype(np.float32)
    if p.paged_kv or p.family in ("fwd_pagedkv", "batch_prefill"):
        lens = p.seqlens_k or ((p.seqlen_k,) * p.batch)
        ks = [rng.standard_normal((p.nhead_k, L, p.hdim_q)) for L in lens]
        vs = [rng.standard_normal((p.nhead_k, L, p.hdim_v)) for L in lens]
        kc, vc, tables = pack_paged_kv(p, ks, vs, rng=rng)
        t["k_cache"], t["v_cache"] = quantize(kc, dt), quantize(vc, dt)
        t.update(tables)
        if p.family == "fwd_appendkv":
            t["knew"] = _rand(rng, sh["knew"], dt)
            t["vnew"] = _rand(rng, sh["vnew"], dt)
    elif p.family == "fwd_appendkv":
        t["k_cache"] = _rand(rng, sh["k_cache"], dt)
        t["v_cache"] = _rand(rng, sh["v_cache"], dt)
        t["knew"] = _rand(rng, sh["knew"], dt)
        t["vnew"] = _rand(rng, sh["vnew"], dt)
    else:
        t["k"] = _rand(rng, sh["k"], dt)
        t["v"] = _rand(rng, sh["v"], dt)
    if p.family == "fwd_appendkv" and p.rope != "none":
        npos = max(p.seqlens_k) + max(p.seqlen_knew, p.seqlen_q) + 1
        ang = np.arange(npos)[:, None] / (10000 ** (np.arange(p.rotary_dim // 2) / (p.rotary_dim / 2)))
        t["rotary_cos"] = np.cos(ang).astype(np.float32)
        t["rotary_sin"] = np.sin(ang).astype(np.float32)
    if p.family in BWD:
        fp = attrs.evolve(p, family="fwd", dbias=False, deterministic=False)
        r = R.fwd(fp, t["q"], t["k"], t["v"], **_pick(t, _EXTRAS))
        t["o"] = _store(p, r.o)
        t["lse"] = np.asarray(r.lse, np.float32)
        t["do"] = _rand(rng, sh["do"], dt)
    return t


def tolerance(problem: FmhaProblem) -> dict:
    """(rtol, atol) per output: outputs are O(1); dq/dk/dv grow with sqrt(seqlen)."""
    base = {"fp16": 2e-2, "bf16": 6e-2, "fp32": 2e-4}.get(problem.dtype, 2.5e-1)
    grow = math.sqrt(max(problem.seqlen_k or 1, problem.seqlen_q or 1))
    tol = {"o": (base, base), "lse": (base, base), "o_acc": (base, base), "q_rot": (base, base),
           "k_cache": (base, base), "v_cache": (base, base)}
    for n in ("dq", "dk", "dv", "dbias"):
        tol[n] = (base * 2, base * grow)
    return tol


def flops(problem: FmhaProblem) -> float:
    p = problem
    sq = p.total_q / max(p.batch, 1) if p.is_group else p.seqlen_q
    sk = p.seqlen_k or 0
    f = 2.0 * p.batch * p.nhead_q * sq * sk * (p.hdim_q + p.hdim_v)
    if p.is_causal:
        f /= 2
    return f * (2.5 if p.family in BWD else 1.0)
