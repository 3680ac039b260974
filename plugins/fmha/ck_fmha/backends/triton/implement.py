"""What the plugin's ``implement`` and ``render`` hooks return for a Triton FMHA key: the launcher
that runs exactly that key's kernels on torch tensors (:func:`make_launcher`, through the kernel
cache: :func:`kernel_via`), and its ahead-of-time rendering (:func:`render`, :func:`jit_calls`).
The records, names, legality and enumeration of the keys are :mod:`.keys`'.  Split from keys.py by
role (issue #30).
"""
from __future__ import annotations

import functools
import hashlib
import inspect
from typing import Optional

import attrs

from ck_core.errors import InvalidProblem
from ck_core.memory import persistent

from .configs import GLUON_BWD_VARIANTS, fp8_format, fp8_v_trans
from .keys import GLUON_VARIANTS, TritonFmhaSig, _arch_spec, artifact_name, parse_dq, supports


# -- launchers ----------------------------------------------------------------------------

def _mask(p) -> dict:
    if p.mask == "none":
        return {"causal": False, "window": (-1, -1), "align": "top_left"}
    align = "bottom_right" if p.mask == "bottom_right" else "top_left"
    return {"causal": False, "window": (p.window_left, p.window_right), "align": align}


def _alibi_align(p) -> str:
    """Which ALiBi form the reference uses for this mask (ck_fmha.masks.alibi_bias)."""
    if p.is_causal:
        return "vertical"
    return "top_left" if p.mask in ("top_left", "generic") else "bottom_right"


def _features(p, t, tdt) -> dict:
    """Bias / ALiBi / dropout keyword arguments of ops.fwd / ops_bwd.bwd_dq_dk_dv from the problem."""
    kw = {}
    if p.bias == "elementwise":
        kw["bias"] = _as_kernel_dtype(p, "bias", t["bias"], tdt)
    elif p.bias == "alibi":
        kw["alibi_slopes"] = t["alibi_slopes"]
        kw["alibi_align"] = _alibi_align(p)
    if p.p_drop > 0:
        kw.update(dropout_p=p.p_drop, seed=p.seed, offset=p.offset)
    return kw


def _sinks(p, t) -> dict:
    """Sink-token / sink-logit keyword arguments of the Triton forwards."""
    kw = {}
    if p.sink_tokens:
        kw["sink_tokens"] = p.sink_tokens
    if p.sink_logits:
        kw["sink"] = t["sink"]
    return kw


def _torch_dtype(token, arch_name: Optional[str] = None):
    """torch dtype of a key's data; fp8 is the arch's e4m3 flavour (:func:`fp8_format`)."""
    import torch

    if token == "fp8":
        fmt = fp8_format(_arch_spec(arch_name) if arch_name else None)
        return {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}[fmt]
    return {"fp16": torch.float16, "bf16": torch.bfloat16}[token]


#: the kernels a key launches whose code depends on none of its fields (fixed meta-parameters; the head
#: dims' classes and the varlen flag are their constexprs): named ``fmha/<kernel>`` in the kernel cache,
#: not per key (``triton_artifacts.entry_name``), so every key of a class loads one entry
_KEYLESS = frozenset({"fmha_bwd_dot_do_o_kernel", "fmha_bwd_convert_dq_kernel", "fmha_bwd_sum_partials_kernel"})


def kernel_via(key, capture: Optional[list] = None):
    """How the launcher of ``key`` launches a Triton kernel (``ops``' ``_via``): through
    :mod:`ck_core.backends.triton_artifacts` as cache entry ``<artifact name>/<kernel name>``
    (:func:`.keys.artifact_name`: keys of one head-dim class share it; ``fmha/<kernel name>`` for the
    kernels of :data:`_KEYLESS`), the entry ``ck build`` writes; with ``capture``, the launch is appended to it as
    ``(suffix, fn, args, kwargs)`` instead (:func:`jit_calls`)."""
    from ck_core.backends import triton_artifacts

    from . import warm

    prefix = artifact_name(key)

    def via(fn, grid):
        kname = getattr(fn, "__name__", type(fn).__name__)   # (tests wrap kernels in spies)
        # a kernel whose code depends on none of the key's fields: one entry for every key
        suffix = (triton_artifacts.SHARED + "fmha/" + kname) if kname in _KEYLESS else "/" + kname
        if capture is not None:
            return lambda *args, **kwargs: capture.append((suffix, fn, args, kwargs))
        launch = triton_artifacts.bind(triton_artifacts.entry_name(prefix, suffix), fn, grid,
                                       triton_artifacts.compile_options(key))
        return warm.wrap(fn, grid, launch)   # (recorded inside warm.recording())

    return via


def make_launcher(key, capture: Optional[list] = None):
    """Stage launcher for one key: ``(problem, tensors) -> {name: tensor}`` on torch tensors.
    ``capture``: see :func:`kernel_via`."""
    import torch

    from ... import plan as stages
    from . import launch as ops
    from . import launch_decode as ops_dec
    from . import launch_bwd as ops_bwd

    via = kernel_via(key, capture)
    fam = key.signature.family
    alg = key.algorithm
    cfg = alg.config()
    tdt = _torch_dtype(key.signature.dtype, key.arch)
    device_cache: dict = {}

    def dev_int32(p, name, values, like):
        """Host-side problem data uploaded once per problem (never read back: no host sync), kept in no
        CUDA graph's pool (:func:`ck_core.memory.persistent`: a first call may run in a graph's warm-up)."""
        k = (p, name)
        t = device_cache.get(k)
        if t is None:
            t = persistent(lambda: torch.tensor(values, dtype=torch.int32, device=like.device), like.device)
            device_cache[k] = t
        return t

    def lens(p, like):
        """Group mode's logical key lengths (shorter than the seqstart_k spans), when given."""
        return {} if p.seqlens_k is None else {"seqlens_k": dev_int32(p, "lens", p.seqlens_k, like)}

    def cast(p, t, names):
        """The named tensors in the key's dtype (see :func:`_as_kernel_dtype`)."""
        return {n: _as_kernel_dtype(p, n, t[n], tdt) for n in names if n in t}

    v_trans = fp8_v_trans(_arch_spec(key.arch)) if key.signature.dtype == "fp8" else None

    def fwd(p, t):
        x = cast(p, t, ("q", "k", "v"))
        layout, kw = p.layout, {}
        v = x["v"]
        if p.vlayout == "c":   # [B, Hk, Dv, Sk] / [Hk, Dv, Tk]: the same data as a key-contiguous V view
            v = v.permute(2, 0, 1) if p.is_group else (v.transpose(2, 3) if p.layout == "bhsd"
                                                        else v.permute(0, 3, 1, 2))
        layout, kw = varlen(p, t, x["q"])
        if p.dtype == "fp8":   # per-tensor descales from the problem; o in bf16 (stages._store)
            kw.update(q_descale=p.scale_q, k_descale=p.scale_k, v_descale=p.scale_v, out_dtype=torch.bfloat16,
                      fp8_v_trans=v_trans)
        o, lse = ops.fwd(x["q"], x["k"], v, scale=p.softmax_scale, softcap=p.logits_soft_cap,
                         return_lse=True, layout=layout, config=cfg, **_mask(p), **kw, **_features(p, t, tdt),
                         **_sinks(p, t), _via=via)
        out = {"o": o, "lse": lse}
        if p.store_randval:
            out["randval"] = ops.dropout_randval(
                p.batch, p.nhead_q, p.seqlen_q, p.seqlen_k, dropout_p=p.p_drop, seed=p.seed, offset=p.offset,
                device=o.device, cu_seqlens_q=kw.get("cu_seqlens_q"), cu_seqlens_k=kw.get("cu_seqlens_k"),
                total_q=p.total_q, seqlens_k=kw.get("seqlens_k"))
        return out

    def _kv(p, t):
        if p.paged_kv:
            x = cast(p, t, ("k_cache", "v_cache"))
            kc, vc = x["k_cache"], x["v_cache"]
            if p.layout == "bhsd":   # [pages, Hk, P, D]
                page_size, hk = kc.shape[2], kc.shape[1]
                kvs = (kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2))
            else:                    # [pages, P, Hk, D]
                page_size, hk = kc.shape[1], kc.shape[2]
                kvs = (kc.stride(0), kc.stride(2), kc.stride(1), vc.stride(0), vc.stride(2), vc.stride(1))
            bt = t["block_table"]
            return kc, vc, dict(page_size=page_size, block_table=bt.to(dtype=torch.int32),
                                max_seqlen_k=p.seqlen_k if p.runtime_seqlens_k else max(p.seqlens_k),
                                kv_strides=kvs, hk=hk)
        x = cast(p, t, ("k", "v"))
        k, v = ops._last_contig(x["k"]), ops._last_contig(x["v"])
        _, hk, sk, _ = ops._dims(k, p.layout)
        kvs = ops._bhs_strides(k, p.layout) + ops._bhs_strides(v, p.layout)
        return k, v, dict(page_size=0, block_table=None, max_seqlen_k=sk, kv_strides=kvs, hk=hk)

    def splitkv_main(p, t):
        q = cast(p, t, ("q",))["q"]
        k, v, kw = _kv(p, t)
        if p.runtime_seqlens_k:   # this step's lengths, on the device: read by the kernel, never by the host
            seqlens = t["seqlens_k"]
        else:
            seqlens = dev_int32(p, "lens", p.seqlens_k, q) if p.seqlens_k else None
        # one split (the plan's one stage, or fwd_pagedkv): the kernel writes o and lse itself
        direct = p.num_splits == 1 and (alg.splits or 1) == 1
        oacc, lacc = ops_dec._splitkv_main(q, k, v, seqlens_k=seqlens, scale=p.softmax_scale,
                                       softcap=p.logits_soft_cap, num_splits=alg.splits or 1, layout=p.layout,
                                       config=cfg, **_mask(p), **kw, **_sinks(p, t), _via=via, direct=direct)
        return {"o": oacc, "lse": lacc} if direct else {"o_acc": oacc, "lse_acc": lacc}

    def combine(p, t):
        q = cast(p, t, ("q",))["q"]
        o, lse = ops_dec.splitkv_combine(t["o_acc"], t["lse_acc"], q, layout=p.layout, return_lse=True, _via=via)
        return {"o": o, "lse": lse}

    def pagedkv(p, t):
        out = splitkv_main(p, t)
        return out if "o" in out else combine(p, dict(t, **out))

    def offsets(p, t, name, like):
        """Group-mode offsets on the device: the problem's (validated by it: R14, R18, R21), or the
        caller's run-time tensor as int32, which the kernels check themselves (bad ones: NaN outputs
        and the device flag, in the same launch).  No host synchronisation either way."""
        if not p.runtime_seqstarts:
            return dev_int32(p, name, p.seqstart_q if name == "sq" else p.seqstart_k, like)
        key = "cu_seqlens_q" if name == "sq" else "cu_seqlens_k"
        cu = t[key]
        if cu.dim() != 1 or cu.numel() != p.batch + 1:
            raise InvalidProblem(f"{key} has shape {tuple(cu.shape)}; expected [{p.batch + 1}]")
        return ops.offsets_i32(cu, like.device)

    def varlen(p, t, like, k=True):
        """(layout, group-mode keywords): device cu_seqlens and the problem's maxima, no host sync."""
        if not p.is_group:
            return p.layout, {}
        kw = dict(cu_seqlens_q=offsets(p, t, "sq", like), max_seqlen_q=p.seqlen_q, _trusted_varlen=True)
        if k:
            kw.update(cu_seqlens_k=offsets(p, t, "sk", like), max_seqlen_k=p.seqlen_k, **lens(p, like))
        return "thd", kw

    def dot_do_o(p, t):
        x = cast(p, t, ("o", "do"))
        layout, kw = varlen(p, t, x["o"], k=False)
        return {"d": ops_bwd.bwd_dot_do_o(x["o"], x["do"], layout=layout, **kw, _via=via)}

    dq_choice = parse_dq(alg.dq) if fam == "bwd_dq_dk_dv" else None
    if dq_choice is not None and dq_choice[0] == "triton" and alg.dchunk:   # the key's chunk runs in both passes
        dq_choice = ("triton", dq_choice[1].with_(DCHUNK=alg.dchunk))
    kv_choice = (("gluon", (alg.block_m, alg.num_stages, alg.variant.endswith("_pers")))
                 if alg.variant in GLUON_BWD_VARIANTS else ("triton", cfg))

    def dq_dk_dv(p, t):
        x = cast(p, t, ("q", "k", "v", "do"))
        layout, kw = varlen(p, t, x["q"])
        res = ops_bwd.bwd_dq_dk_dv(x["q"], x["k"], x["v"], x["do"], t["lse"], t["d"],
                               scale=p.softmax_scale, softcap=p.logits_soft_cap, layout=layout,
                               choice=(kv_choice, dq_choice), return_dbias=p.dbias,
                               **_mask(p), **kw, **_features(p, t, tdt), _via=via)
        dq, dqa, dk, dv = res[:4]
        out = {"dq": dq, "dk": dk, "dv": dv} if dq is not None else {"dq_acc": dqa, "dk": dk, "dv": dv}
        if p.dbias:
            out["dbias"] = res[4]
        return out

    def convert_dq(p, t):
        """dQ from the fp32 accumulator (nothing in deterministic mode: stage 2 wrote dq).  Bad run-time
        group-mode offsets: the kernels made every gradient NaN themselves."""
        if t.get("dq_acc") is None:
            return {}
        q = cast(p, t, ("q",))["q"]
        layout, kw = varlen(p, t, q)
        if p.is_group:
            kw["total_k"] = p.packed_k if p.runtime_seqstarts else p.seqstart_k[-1]
        return {"dq": ops_bwd.bwd_convert_dq(t["dq_acc"], ops._last_contig(q), layout=layout, **kw, _via=via)}

    def appendkv(p, t):
        """Writes knew/vnew into t['k_cache'] / t['v_cache'] IN PLACE (when they already have the
        kernel's dtype; else into converted copies) and returns the caches under the same names."""
        x = cast(p, t, ("q", "knew", "vnew", "k_cache", "v_cache"))
        rope = {}
        if p.rope != "none":
            need = _longest_before_append(p, t) + max(p.seqlen_knew, p.seqlen_q)
            if t["rotary_cos"].shape[0] < need:   # the kernel does not bound-check table rows
                raise InvalidProblem(f"rotary tables have {t['rotary_cos'].shape[0]} positions; need at least {need}")
            rope = dict(rotary_cos=t["rotary_cos"], rotary_sin=t["rotary_sin"], rope=p.rope,
                        rotary_dim=p.rotary_dim)
        bt = t["block_table"] if p.paged_kv else None
        lens = t["seqlens_k"] if p.runtime_seqlens_k else dev_int32(p, "lens", p.seqlens_k, x["q"])
        q_rot, kc, vc = ops_dec.appendkv_launch(x["q"], x["knew"], x["vnew"], x["k_cache"], x["v_cache"], lens,
                                            block_table=bt, layout=p.layout, block_m=alg.block_m, **rope,
                                            _via=via)
        return {"q_rot": q_rot, "k_cache": kc, "v_cache": vc}

    def prefill(p, t):
        x = cast(p, t, ("q", "k_cache", "v_cache"))
        q = x["q"]
        if p.kv_lookup == "sglang":
            tables = dict(kv_indptr=t["kv_indptr"], kv_page_indices=t["kv_page_indices"])
        else:
            tables = dict(block_table=t["block_table"])
        if p.runtime_seqlens_k:   # read on the device; seqlen_k is their bound
            lens, longest = t["seqlens_k"], p.seqlen_k
        else:
            lens, longest = dev_int32(p, "lens", p.seqlens_k, q), max(p.seqlens_k)
        cu_q = offsets(p, t, "sq", q)
        o, lse = ops_dec.batch_prefill_launch(q, x["k_cache"], x["v_cache"], lens,
                                   cu_seqlens_q=cu_q, max_seqlen_q=p.seqlen_q,
                                   max_seqlen_k=longest, kv_layout=p.kv_layout, scale=p.softmax_scale,
                                   softcap=p.logits_soft_cap, return_lse=True, config=cfg, _trusted_varlen=True,
                                   **tables,
                                   **_mask(p), **_features(p, t, tdt), **_sinks(p, t), _via=via)
        return {"o": o, "lse": lse}

    def warm_fwd(p, t):
        """``f(q, k, v) -> {"o", "lse"}`` repeating :func:`fwd` on tensors like ``t`` without its
        argument processing (the public API's warm-call cache, whose signature pins shapes,
        strides, dtypes, device and 16-byte alignment), or None: the launch, recorded once more
        here (:mod:`.warm`), must read only q, k, v, o, lse and the device error flag."""
        from ck_core.backends import triton_replay

        from . import warm

        if set(t) != {"q", "k", "v"} or p.is_group or p.store_randval or p.dtype == "fp8" \
                or any(t[n].dtype != tdt or not triton_replay.replayable(t[n]) for n in t):
            return None
        with warm.recording() as recs:
            out = fwd(p, dict(t))
        return warm.replayer(t, out, recs)

    table = {"fwd": fwd, "fwd_splitkv": splitkv_main, "fwd_splitkv_combine": combine,
             "fwd_appendkv": appendkv, "batch_prefill": prefill, "fwd_pagedkv": pagedkv,
             "bwd_dot_do_o": dot_do_o, "bwd_dq_dk_dv": dq_dk_dv,
             "bwd_convert_dq": convert_dq}
    run = table[fam]
    check_names = stages.check_tensor_names

    def launch(p, t):
        check_names(p, t)
        return run(p, t)

    if fam == "fwd":
        launch.warm = warm_fwd
    return launch


def _longest_before_append(p, t) -> int:
    """The longest cache length before an append: the problem's, host run-time lengths read here (no
    sync), or for device run-time lengths the bound the capacity sets (seqlen_k >= length + seqlen_knew)."""
    if not p.runtime_seqlens_k:
        return max(p.seqlens_k)
    lens = t["seqlens_k"]
    if lens.device.type == "cpu" and lens.numel():
        return int(lens.max())
    return p.seqlen_k - p.seqlen_knew


_E4M3 = ()


def _as_kernel_dtype(p, name, x, tdt):
    """A tensor in the kernel's dtype ``tdt``.  Another dtype is refused (a float32 q for an fp16
    problem would be rounded silently), except float32 for bf16 / fp8 problems: that is their numpy
    storage, as ck_core's backends hand numpy data over.  Those are converted; fp8 values outside the
    e4m3 range are refused (torch would saturate or NaN them), which reads one flag back from the
    device on this conversion path only (tensors already in fp8 cost nothing)."""
    import torch

    global _E4M3
    if not _E4M3:
        _E4M3 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz") if hasattr(torch, n))
    if x.dtype == tdt:
        return x
    if not isinstance(x, torch.Tensor):
        raise InvalidProblem(f"tensor {name!r} is a {type(x).__module__}.{type(x).__qualname__}; the triton "
                             "backend takes torch tensors (convert it with torch.from_numpy, or "
                             "Dispatcher.backend_spec.to_backend(x))")
    if p.dtype == "fp8" and x.device.type == "cpu" and x.dtype in _E4M3:
        return x   # the interpreter computes either e4m3 flavour (a GPU multiplies its arch's, fp8_format)
    if not (x.dtype == torch.float32 and p.dtype in ("bf16", "fp8")):
        raise InvalidProblem(f"tensor {name!r} has dtype {x.dtype}; the problem's dtype {p.dtype} needs {tdt}"
                             + (" (or float32 holding bf16 / fp8 values)" if p.dtype in ("bf16", "fp8") else "")
                             + ": convert it, or build the problem with the tensor's dtype")
    if p.dtype == "fp8":
        fmax = float(torch.finfo(tdt).max)
        if bool((x.abs() > fmax).any()):
            raise InvalidProblem(f"tensor {name!r} holds values outside the {tdt} range +-{fmax:g}; quantise "
                                 "(scale into range and pass the factor as scale_q/k/v) before the fp8 forward")
    return x.to(tdt)


# -- ahead-of-time compilation --------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _source_hash(gluon: bool = False) -> str:
    """Hash of the kernel sources a key compiles from (Gluon keys: gluon_fwd.py, not kernels.py)."""
    from . import configs, gluon_fwd, kernels

    src = inspect.getsource(gluon_fwd if gluon else kernels) + inspect.getsource(configs)
    return hashlib.sha256(src.encode()).hexdigest()


@attrs.frozen
class TritonFmhaRendered:
    family: str
    dtype: str
    config: dict
    source_hash: str
    options: dict
    #: the key's launches on a representative problem (:func:`jit_calls`), which ``ck build``
    #: compiles into the entries the launcher loads; None where the launcher does not load them
    jit_calls: Optional[object] = None
    #: the prefix of the kernel-cache entries the launcher loads (``<artifact name>/<kernel name>``,
    #: :func:`.keys.artifact_name`); ``ck build`` writes its ``jit_calls`` there
    artifact_name: Optional[str] = None

    def compile(self, target, extra_options=None):
        from .aot import aot_compile

        return aot_compile(self.family, self.dtype, self.config, target)


#: the representative batch-mode problem of fwd and the backward: sizes that are multiples of
#: every tile and of 16, MHA: sizes are run-time integers (kernels.py), so any batch, head count,
#: GQA group and length of the key's alignment class loads what this problem built
_JIT_BATCH, _JIT_HEADS, _JIT_SEQ = 2, 16, 512
#: the backward's ragged representative is _JIT_SEQ - _JIT_RAGGED long (no tile divides it); the
#: bottom-right causal one has as many queries over _JIT_SEQ + _JIT_CROSS keys
_JIT_RAGGED, _JIT_CROSS = 7, 128
#: the decode-step representative of the split-KV / paged / append-KV families: Llama-style GQA
#: (32 query heads over 8 key heads), one query row, a 4096-key cache, vLLM's 16-token pages;
#: batch_prefill: two sequences of 512 queries over the same pages
_DEC_BATCH, _DEC_HQ, _DEC_HK, _DEC_SK, _DEC_PAGE, _PREFILL_SQ = 2, 32, 8, 4096, 16, 512
#: the split counts a combine key is built for (the key has none; the count is the problem's): one
#: per BLOCK_S (max(2, the next power of two)), the only constexpr the count sets (NUM_SPLITS is a
#: run-time integer)
_COMBINE_SPLITS = (2, 3, 5, 9, 17, 33, 65)


def _representatives(key, batch: Optional[int] = None):
    """``[(problem, tensors)]`` that :func:`jit_calls` runs the launcher on, those the key supports
    (``tensors()``: meta tensors, nothing runs, laid out as the public entry points hand them over).
    ``batch``: another batch size, the same specialisation (tests: a problem other than the built one)."""
    return [(p, t) for p, t in _candidates(key, batch) if supports(key, p) is None]


def _candidates(key, batch):
    import torch

    from ...problem import FmhaProblem

    s, fam = key.signature, key.signature.family
    tdt = _torch_dtype(s.dtype, key.arch)
    f32, i32 = torch.float32, torch.int32

    def meta(*shape, dt=tdt):
        return torch.empty(shape, dtype=dt, device="meta")

    dims = dict(hdim_q=s.hdim_q, hdim_v=s.hdim_v, dtype=s.dtype)
    causal_br = dict(mask="bottom_right", window_left=-1, window_right=0)   # decode's causal mask
    if fam in ("fwd", "bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq"):
        b, h, n = batch or _JIT_BATCH, _JIT_HEADS, _JIT_SEQ
        hk = h // key.algorithm.gsplit if key.algorithm.gsplit else h   # a group split needs a GQA group that size

        def v_fwd(n):   # fp8 on an arch that reads V key-contiguous: as ops.v_key_major lays it out
            if s.dtype == "fp8" and fp8_v_trans(_arch_spec(key.arch)):
                return meta(b, h, s.hdim_v, n).transpose(2, 3)
            return meta(b, h, n, s.hdim_v)

        tensors = {"fwd": lambda n, nk: dict(q=meta(b, h, n, s.hdim_q), k=meta(b, h, nk, s.hdim_q), v=v_fwd(nk)),
                   "bwd_dot_do_o": lambda n, nk: dict(o=meta(b, h, n, s.hdim_v), do=meta(b, h, n, s.hdim_v)),
                   "bwd_dq_dk_dv": lambda n, nk: dict(q=meta(b, h, n, s.hdim_q), k=meta(b, hk, nk, s.hdim_q),
                                                      v=meta(b, hk, nk, s.hdim_v), do=meta(b, h, n, s.hdim_v),
                                                      lse=meta(b, h, n, dt=f32), d=meta(b, h, n, dt=f32)),
                   "bwd_convert_dq": lambda n, nk: dict(q=meta(b, h, n, s.hdim_q),
                                                        dq_acc=meta(b, h, n, s.hdim_q, dt=f32))}[fam]
        masks = ("none",) if fam in ("bwd_dot_do_o", "bwd_convert_dq") else ("none", "top_left")   # no mask there
        # sizes are run-time values (kernels.py: what the kernels specialise on); the backward's one
        # size-derived constexpr is whether both lengths are whole tiles (launch._even): a ragged
        # length too, so every problem of the key's alignment class loads a built kernel
        lens = (n, n - _JIT_RAGGED) if fam == "bwd_dq_dk_dv" else (n,)
        out = [(FmhaProblem(family=fam, batch=b, nhead_q=h, nhead_k=hk, seqlen_q=ln, seqlen_k=ln, mask=m,
                            lse=fam == "fwd", **dims), functools.partial(tensors, ln, ln)) for ln in lens for m in masks]
        # a causal mask aligned bottom-right (FlashAttention's causal: BOTTOM_RIGHT), over more keys than
        # queries (ragged); the backward also square with whole tiles (its EVEN class)
        brs = {"fwd": ((n - _JIT_RAGGED, n + _JIT_CROSS),),
               "bwd_dq_dk_dv": ((n - _JIT_RAGGED, n + _JIT_CROSS), (n, n))}.get(fam, ())
        for sq, sk in brs:
            out.append((FmhaProblem(family=fam, batch=b, nhead_q=h, nhead_k=hk, seqlen_q=sq, seqlen_k=sk,
                                    mask="bottom_right", lse=fam == "fwd", **dims), functools.partial(tensors, sq, sk)))
        return out
    b, hq, hk, sk, ps = batch or _DEC_BATCH, _DEC_HQ, _DEC_HK, _DEC_SK, _DEC_PAGE
    dec = dict(batch=b, nhead_q=hq, nhead_k=hk, seqlen_q=1, seqlen_k=sk, **dims)
    pages = b * (sk // ps)

    def paged_kv(d):   # paged_decode's bhsd view of [pages, P, Hk, D] pools
        return meta(pages, ps, hk, d).transpose(1, 2)

    table = lambda: meta(b, sk // ps, dt=i32)   # noqa: E731
    if fam in ("fwd_splitkv", "fwd_pagedkv"):
        n = key.algorithm.splits or 1
        q = lambda: meta(b, hq, 1, s.hdim_q)   # noqa: E731
        kw = dict(dec, family=fam, num_splits=n, lse=True)
        paged = FmhaProblem(**kw, runtime_seqlens_k=True, paged_kv=True, page_size=ps, **causal_br)
        out = [(paged, lambda: dict(q=q(), k_cache=paged_kv(s.hdim_q), v_cache=paged_kv(s.hdim_v),
                                    block_table=table(), seqlens_k=meta(b, dt=i32)))]
        if fam == "fwd_splitkv":   # splitkv_decode: contiguous caches, with and without run-time lengths
            kv = lambda: dict(q=q(), k=meta(b, hk, sk, s.hdim_q), v=meta(b, hk, sk, s.hdim_v))   # noqa: E731
            out = [(FmhaProblem(**kw), kv),
                   (FmhaProblem(**kw, runtime_seqlens_k=True, **causal_br), lambda: dict(kv(), seqlens_k=meta(b, dt=i32)))
                   ] + out
        return out
    if fam == "fwd_splitkv_combine":
        p = FmhaProblem(family=fam, lse=True, **dec)
        return [(attrs.evolve(p, num_splits=n),
                 functools.partial(lambda n: dict(q=meta(b, hq, 1, s.hdim_q), o_acc=meta(b, hq, 1, n, s.hdim_v, dt=f32),
                                                  lse_acc=meta(b, hq, 1, n, dt=f32)), n))
                for n in _COMBINE_SPLITS]
    if fam == "fwd_appendkv":   # one new token per step, into contiguous and paged caches
        new = lambda: dict(q=meta(b, hq, 1, s.hdim_q), knew=meta(b, hk, 1, s.hdim_q),   # noqa: E731
                           vnew=meta(b, hk, 1, s.hdim_v), seqlens_k=meta(b, dt=i32))
        kw = dict(dec, family=fam, seqlen_knew=1, runtime_seqlens_k=True)
        return [(FmhaProblem(**kw),
                 lambda: dict(new(), k_cache=meta(b, hk, sk, s.hdim_q), v_cache=meta(b, hk, sk, s.hdim_v))),
                (FmhaProblem(**kw, paged_kv=True, page_size=ps),
                 lambda: dict(new(), k_cache=paged_kv(s.hdim_q), v_cache=paged_kv(s.hdim_v), block_table=table()))]
    if fam == "batch_prefill":   # vLLM block tables over linear pages, causal and not
        sq = _PREFILL_SQ
        kw = dict(dec, family=fam, mode="group", seqstart_q=tuple(range(0, (b + 1) * sq, sq)), seqlen_q=sq,
                  runtime_seqlens_k=True, paged_kv=True, page_size=ps, kv_layout="linear", kv_lookup="vllm", lse=True)
        t = lambda: dict(q=meta(b * sq, hq, s.hdim_q), k_cache=meta(pages, ps, hk, s.hdim_q),   # noqa: E731
                         v_cache=meta(pages, ps, hk, s.hdim_v), block_table=table(), seqlens_k=meta(b, dt=i32))
        return [(FmhaProblem(**kw), t), (FmhaProblem(**kw, **causal_br), t)]
    return []


def jit_calls(key) -> list:
    """The launches of ``key``'s launcher (:func:`make_launcher`) on its representative problems
    (:func:`_representatives`), ``[(suffix, fn, args, kwargs)]``: what ``ck build`` compiles.
    A representative the key cannot run (:func:`supports`) is skipped."""
    calls: list = []
    launch = make_launcher(key, capture=calls)
    for p, tensors in _representatives(key):
        launch(p, tensors())
    return calls


def render(key, backend: str):
    if backend != "triton" or not isinstance(key.signature, TritonFmhaSig):
        raise InvalidProblem(f"{key.name}: only Triton FMHA keys render (CK-rule keys are CK Tile instances)")
    s, a = key.signature, key.algorithm
    cfg = dict(a.config().as_dict(), hdim_q=s.hdim_q, hdim_v=s.hdim_v)
    dtype = s.dtype
    if dtype == "fp8":   # the arch's e4m3 flavour as a Triton type; o in bf16
        from .aot import FP8_TRITON

        spec = _arch_spec(key.arch)
        dtype = FP8_TRITON[fp8_format(spec)]
        cfg["out_dtype"] = "bf16"
        if fp8_v_trans(spec):   # the kernel the launcher runs: key-contiguous V
            cfg["v_trans"] = True
    src = _source_hash(a.variant in GLUON_VARIANTS)   # (a Gluon key builds its bhsd, non-causal, LSE instance)
    h = hashlib.sha256((src + repr(sorted(cfg.items())) + s.family + dtype).encode()).hexdigest()
    return TritonFmhaRendered(s.family, dtype, cfg, h, {"num_warps": a.num_warps, "num_stages": a.num_stages},
                              functools.partial(jit_calls, key) if _representatives(key) else None,
                              artifact_name(key))
