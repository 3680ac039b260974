"""The conv kernels described for ahead-of-time builds: ``kernel_for(config_or_name)`` gives
``(jit_fn, constexprs, grid)`` with ``grid(problem)`` the launch grid, ``aot_signature(config)`` the
argument types (what ``triton.compile(ASTSource(...))`` needs), ``aot_source_args`` both for a key,
``reduce_aot_source_args`` the split reduction's epilogue kernel.  Split from :mod:`.launch`
(issue #30): the launcher launches; this module describes what it launches.
"""
from __future__ import annotations

import math

from ck_core.errors import InvalidProblem

from ...geometry import _cdiv, _class_rows, _pad3, geometry, streamk_programs, tma_blocks
from ...keys import ConvKernelConfig
from ...problem import ConvProblem
from .launch import _REDUCE_BLOCK, _flat_args, _rows_args, _rows_grid

_BW_GEO = ["Di", "Hi", "Wi", "Do", "Ho", "Wo", "C", "K", "CS", "KS", "sd", "sh", "sw", "pd", "ph", "pw",
           "dd", "dh", "dw", "FZ", "FY", "FX", "WS_STRIDE"]
_ARGS = {
    ("forward", False): ["x_ptr", "w_ptr", "y_ptr", "fin_ptr", "cnt_ptr", "M", "Di", "Hi", "Wi", "Do", "Ho", "Wo",
                         "C", "K", "CS", "KS", "sd", "sh", "sw", "pd", "ph", "pw", "dd", "dh", "dw", "FZ", "FY", "FX",
                         "IT_CHUNK", "WS_STRIDE"],
    ("bwd_data", False): ["dy_ptr", "w_ptr", "dx_ptr", "tab_ptr", "ntap_ptr", "fin_ptr", "cnt_ptr", "Mr", "Rd",
                          "Rh", "Rw", "Di", "Hi", "Wi", "Do", "Ho", "Wo", "C", "K", "CS", "KS", "T", "TMAX",
                          "sd", "sh", "sw", "IT_CHUNK", "NSPLIT", "WS_STRIDE"],
    ("bwd_data_tm", False): ["dy_ptr", "w_ptr", "dx_ptr", "ctab_ptr", "fin_ptr", "cnt_ptr", "Mr", "Rd", "Rh", "Rw",
                             "Di", "Hi", "Wi", "Do", "Ho", "Wo", "C", "K", "CS", "KS", "T", "TMAX",
                             "sd", "sh", "sw", "IT_CHUNK", "NSPLIT", "WS_STRIDE"],
    ("flat", True): ["src_ptr", "w_ptr", "dst_ptr", "R", "G", "Dd", "Hd", "Wd", "Ds", "Hs", "Ws", "NSRC",
                     "ad", "ah", "aw", "bd", "bh", "bw", "cd", "ch", "cw", "s_d", "s_h", "s_w"],
    ("rows", True): ["x_ptr", "w_ptr", "y_ptr", "G", "Hi", "Ho", "WGI", "WGO", "ph", "pw"],
    ("bwd_weight", False): ["x_ptr", "dy_ptr", "dw_ptr", "pb_ptr", "pc_ptr", "fin_ptr", "cnt_ptr", "P", "CHUNK"]
    + _BW_GEO,
    ("bwd_weight_gm", False): ["x_ptr", "dy_ptr", "dw_ptr", "pb_ptr", "pc_ptr", "fin_ptr", "cnt_ptr", "P", "CHUNK",
                               "G"] + _BW_GEO,
    ("forward", True): ["x_ptr", "w_ptr", "y_ptr", "M", "G", "Di", "Hi", "Wi", "Do", "Ho", "Wo",
                        "sd", "sh", "sw", "pd", "ph", "pw", "dd", "dh", "dw"],
    ("bwd_data", True): ["dy_ptr", "w_ptr", "dx_ptr", "M", "G", "Di", "Hi", "Wi", "Do", "Ho", "Wo",
                         "sd", "sh", "sw", "pd", "ph", "pw", "dd", "dh", "dw"],
    ("forward_flat", False): ["x_ptr", "w_ptr", "y_ptr", "M", "Di", "Hi", "Wi", "Do", "Ho", "Wo", "C", "K", "CS",
                              "KS", "sd", "sh", "sw", "pd", "ph", "pw", "dd", "dh", "dw", "FZ", "FY", "FX"],
    ("bwd_weight_tma", False): ["x_desc", "dy_desc", "dw_ptr", "fin_ptr", "cnt_ptr", "NBLK", "NWB", "Do", "Ho",
                                "pd", "ph", "pw", "dd", "dh", "dw", "FY", "FX", "C", "K", "T", "WS_STRIDE"],
    ("bwd_weight_flat", False): ["x_ptr", "dy_ptr", "dw_ptr", "fin_ptr", "cnt_ptr", "P", "NBLK"] + _BW_GEO,
    ("bwd_weight", True): ["x_ptr", "dy_ptr", "dw_ptr", "fin_ptr", "cnt_ptr", "P", "NBLK", "G", "Di", "Hi", "Wi", "Do", "Ho", "Wo",
                           "sd", "sh", "sw", "pd", "ph", "pw", "dd", "dh", "dw"],
}


def kernel_for(key_or_config, problem: ConvProblem | None = None):
    """``(jit_fn, constexprs, grid)`` for a kernel config, name, or KernelKey-like object.

    ``grid(problem)`` returns the launch grid for a problem (split as the config
    names it).  ``constexprs`` holds the compile-time values
    plus ``num_warps`` / ``num_stages``; kernel-wide flags that depend on the
    problem (EVEN_C/EVEN_K, ATOMIC) take their general-case value unless a
    problem is given.
    """
    from . import kernels as tk

    cfg = _as_config(key_or_config)
    meta = cfg.triton_meta()
    dwise = cfg.specialization == "depthwise"
    ieee = 1 if cfg.dtype == "fp32" else 0
    if dwise:
        flt = _pad3(problem.filter if problem else (3,) * cfg.ndim, 1)
        if cfg.direction == "bwd_weight":
            from .dw_codegen import dw_bwd_weight_kernel
            fn = dw_bwd_weight_kernel(flt)
        elif cfg.rows:
            from .dw_codegen import dw_fwd_rows_kernel
            fn = dw_fwd_rows_kernel(cfg.tile[0], flt[1], flt[2])
        elif cfg.flat:
            fn = tk.dw_flat_kernel
            meta.update(FZ=flt[0], FY=flt[1], FX=flt[2])
            if problem is not None:
                _, _, _, a, _, _, s = _flat_args(problem, geometry(problem), cfg.direction == "bwd_data")
                meta.update(UNIT_W=a[2] == 1 and s[2] == 1)
            else:
                meta.update(UNIT_W=True)
            meta.update(BWD=cfg.direction == "bwd_data")
        else:
            fn = {"forward": tk.dw_fwd_kernel, "bwd_data": tk.dw_bwd_data_kernel}[cfg.direction]
            meta.update(FZ=flt[0], FY=flt[1], FX=flt[2])
    elif cfg.tma:
        fn = tk.conv_bwd_weight_tma_kernel
        meta["IEEE"] = ieee
        ws = {"atomic": 0, "relaxed": 0, "twostage": 1, "fixup": 2, "atomicfix": 3}[cfg.reduction]
        split = cfg.split > 1
        meta["ATOMIC"] = (2 if cfg.reduction == "relaxed" else True) if split and not ws else False
        meta["WS"] = ws if split else 0
    elif cfg.flat:
        meta["IEEE"] = ieee
        if cfg.direction == "forward":
            fn = tk.conv_fwd_flat_kernel
        else:
            fn = tk.conv_bwd_weight_flat_kernel
            ws = {"atomic": 0, "relaxed": 0, "twostage": 1, "fixup": 2, "atomicfix": 3}[cfg.reduction]
            split = cfg.split > 1
            meta["ATOMIC"] = (2 if cfg.reduction == "relaxed" else True) if split and not ws else False
            meta["WS"] = ws if split else 0
    else:
        fn = {"forward": tk.conv_fwd_kernel,
              "bwd_data": tk.conv_bwd_data_tm_kernel if "STREAMK" in meta else tk.conv_bwd_data_kernel,
              "bwd_weight": tk.conv_bwd_weight_gm_kernel if cfg.group_merge > 1
              else tk.conv_bwd_weight_kernel}[cfg.direction]
        meta["IEEE"] = ieee
        # a workspace reduction is what a config asking for one is built for
        ws = {"atomic": 0, "relaxed": 0, "twostage": 1, "fixup": 2, "atomicfix": 3, "streamk": 2}[cfg.reduction]
        atomic = 2 if cfg.reduction == "relaxed" else True
        gm = cfg.group_merge
        if cfg.direction == "forward":
            meta["EVEN_C"] = bool(problem and problem.c_per_group * gm % meta["BLOCK_K"] == 0)
            meta["ATOMIC"] = False
        elif cfg.direction == "bwd_data":
            meta["EVEN_K"] = bool(problem and problem.k_per_group * gm % meta["BLOCK_K"] == 0)
            meta["ATOMIC"] = False
        else:
            split = cfg.split > 1
            meta["ATOMIC"] = atomic if split and not ws else False
            ws = ws if split else 0
            meta["FAST_DIV"] = True
            meta["TABLE"] = 0 if meta["SPEC"] == 1 else 2 if cfg.tap_mask else 1
        meta["WS"] = ws

    def grid(p: ConvProblem):
        g = geometry(p)
        if dwise and cfg.rows:
            return _rows_grid(p, g, meta["BLOCK"], cfg.tile[0])
        if cfg.tma:
            return (p.taps * _cdiv(g["K"], meta["BLOCK_M"]) * _cdiv(g["C"], meta["BLOCK_N"]), p.G,
                    min(cfg.split, tma_blocks(cfg, p)[0]))
        if cfg.flat and not dwise:
            if p.direction == "forward":
                return (_cdiv(p.N * g["Do"] * g["Ho"] * g["Wo"], meta["BLOCK_M"]) * _cdiv(g["K"], meta["BLOCK_N"]),
                        p.G, 1)
            return (_cdiv(g["K"], meta["BLOCK_M"]) * _cdiv(g["C"] * p.taps, meta["BLOCK_N"]), p.G, cfg.split)
        if dwise and cfg.flat:
            R, dsz, _, _, _, _, _ = _flat_args(p, g, p.direction == "bwd_data")
            return (_cdiv(dsz[2] * p.G, meta["BLOCK_F"]) * _cdiv(R, meta["BLOCK_R"]), 1, 1)
        if cfg.reduction == "streamk":  # as run() launches it on the key's arch (a config: the plan's)
            gm = cfg.group_merge
            if p.direction == "forward":
                ntiles = _cdiv(p.N * g["Do"] * g["Ho"] * g["Wo"], meta["BLOCK_M"]) \
                    * _cdiv(g["K"] * gm, meta["BLOCK_N"])
                steps = (p.taps if meta["SPEC"] != 1 else 1) * _cdiv(g["C"] * gm, meta["BLOCK_K"])
            else:
                crow = _class_rows(g["sd"], g["pad"], g["dil"], g["flt"], g["Ho"], g["Wo"])
                Mr = p.N * _cdiv(g["Di"], g["sd"][0]) * _cdiv(g["Hi"], g["sd"][1]) * _cdiv(g["Wi"], g["sd"][2])
                ntiles = _cdiv(Mr, meta["BLOCK_M"]) * _cdiv(g["C"] * gm, meta["BLOCK_N"]) * len(crow)
                steps = (max(r[0] * r[1] * r[2] for r in crow) if meta["SPEC"] != 1 else 1) \
                    * _cdiv(g["K"] * gm, meta["BLOCK_K"])
            total = ntiles * (p.G // gm) * steps
            n = streamk_programs(cfg, total, steps, _planned_sms(key_or_config), cfg.split)
            return (_cdiv(total, _cdiv(total, n)), 1, 1)
        if dwise:
            if p.direction == "forward":
                return (_cdiv(p.N * g["Do"] * g["Ho"] * g["Wo"], meta["BLOCK_P"]), _cdiv(p.G, meta["BLOCK_G"]), 1)
            if p.direction == "bwd_data":
                return (_cdiv(p.N * g["Di"] * g["Hi"] * g["Wi"], meta["BLOCK_P"]), _cdiv(p.G, meta["BLOCK_G"]), 1)
            return (_cdiv(p.G, meta["BLOCK_G"]), cfg.split, 1)
        gm = cfg.group_merge
        if p.direction == "forward":
            M = p.N * g["Do"] * g["Ho"] * g["Wo"]
            return (_cdiv(M, meta["BLOCK_M"]) * _cdiv(g["K"] * gm, meta["BLOCK_N"]), p.G // gm, cfg.split)
        if p.direction == "bwd_data":
            Mr = p.N * _cdiv(g["Di"], g["sd"][0]) * _cdiv(g["Hi"], g["sd"][1]) * _cdiv(g["Wi"], g["sd"][2])
            return (_cdiv(Mr, meta["BLOCK_M"]) * _cdiv(g["C"] * gm, meta["BLOCK_N"]), p.G // gm,
                    g["sd"][0] * g["sd"][1] * g["sd"][2] * cfg.split)
        return (p.taps * _cdiv(g["K"], meta["BLOCK_M"]) * _cdiv(g["C"], meta["BLOCK_N"]),
                _cdiv(p.G, meta.get("GM", 1)), cfg.split)

    return fn, meta, grid


def aot_signature(key_or_config, constexprs: dict | None = None) -> dict:
    """Argument name -> Triton type string (constexprs as ``"constexpr"``), for
    ``triton.compile(ASTSource(fn, signature, constexprs))``; ``constexprs`` as
    :func:`kernel_for` returns them (its defaults when None)."""
    cfg = _as_config(key_or_config)
    if constexprs is None:
        constexprs = kernel_for(cfg)[1]
    dwise = cfg.specialization == "depthwise"
    # depthwise forward / bwd_data kernels store the output dtype (no split workspace)
    atomic = False if dwise or (cfg.flat and cfg.direction == "forward") \
        else constexprs.get("ATOMIC", True) or bool(constexprs.get("WS", 0))
    ptr = "*" + cfg.dtype
    out_ptr = {"forward": "y_ptr", "bwd_data": "dx_ptr", "bwd_weight": "dw_ptr"}[cfg.direction]
    sig = {}
    kind = "bwd_weight_gm" if cfg.group_merge > 1 and not dwise and cfg.direction == "bwd_weight" \
        else cfg.direction
    if cfg.tma:
        kind = "bwd_weight_tma"
    elif cfg.flat and not dwise:
        kind = cfg.direction + "_flat"
    elif dwise and cfg.rows:
        kind = "rows"
    elif dwise and cfg.flat:
        kind = "flat"
    elif "STREAMK" in constexprs and cfg.direction == "bwd_data":
        kind = "bwd_data_tm"
    for n in _ARGS[(kind, dwise)]:
        if n in ("tab_ptr", "ntap_ptr", "pb_ptr", "pc_ptr", "cnt_ptr", "ctab_ptr"):
            sig[n] = "*i32"
        elif n in ("x_desc", "dy_desc"):
            bm, bn, bk = cfg.tile
            box = [bk, bn if n == "x_desc" else bm]
            sig[n] = f"tensordesc<{cfg.dtype}{box if constexprs.get('LINEAR') else [1, 1, 1] + box}>"
        elif n == "fin_ptr" and dwise:
            sig[n] = ptr   # depthwise atomicfix: the cast-out result
        elif n == out_ptr and (atomic or (dwise and cfg.direction == "bwd_weight")):
            sig[n] = "*fp32"  # split-K workspace
        elif n.endswith("_ptr"):
            sig[n] = ptr
        else:
            sig[n] = "i32"
    for k in constexprs:
        if k not in ("num_warps", "num_stages"):
            sig[k] = "constexpr"
    return sig


def aot_source_args(key_or_config, problem: ConvProblem | None = None):
    """``(fn, signature, constexprs, options)`` ready for ``ASTSource`` and ``triton.compile``."""
    fn, meta, _ = kernel_for(key_or_config, problem)
    sig = aot_signature(key_or_config, meta)
    consts = {k: v for k, v in meta.items() if k not in ("num_warps", "num_stages")}
    missing = [a for a in fn.arg_names if a not in sig]
    if missing:  # a template and its argument table disagree: a bug here, not the caller's
        raise InvalidProblem(f"{fn.__name__}: no AOT type for argument(s) {missing}")
    sig = {a: sig[a] for a in fn.arg_names}
    # pointers are 16-byte aligned (torch allocations), as the JIT would specialise them;
    # channel counts of a given problem that are multiples of 16 are marked too, which
    # is what lets the compiler prove 16-byte vector loads and software-pipeline them
    known = {}
    if problem is not None:
        import math
        numel = {"forward": problem.output_shape, "bwd_data": problem.input_shape,
                 "bwd_weight": problem.weight_shape}[problem.direction]
        known = {"C": problem.c_per_group, "K": problem.k_per_group, "CS": problem.C, "KS": problem.K,
                 "G": problem.G, "WS_STRIDE": math.prod(numel)}
        if fn.__name__ == "dw_flat_kernel":  # every int argument, as the JIT would see it
            bwd = problem.direction == "bwd_data"
            R, dsz, ssz, a, b, c, s = _flat_args(problem, geometry(problem), bwd)
            vals = [R, problem.G, *dsz, *ssz, math.prod(problem.output_shape if bwd else problem.input_shape),
                    *a, *b, *c, *s]
            known = dict(zip(_ARGS[("flat", True)][3:], vals))
        elif fn.__name__ == "kernel" and _as_config(key_or_config).rows:  # the row-reuse kernel
            known = dict(zip(_ARGS[("rows", True)][3:], _rows_args(problem, geometry(problem))))
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
             if sig[a].startswith("*") or (a in known and known[a] % 16 == 0)}
    return fn, sig, consts, {"num_warps": meta["num_warps"], "num_stages": meta["num_stages"], "attrs": attrs}


def reduce_aot_source_args(dtype: str):
    """``(fn, signature, constexprs, options)`` of the second stage of ``twostage``
    reductions (:func:`ck_conv.backends.triton.kernels.splitk_reduce_kernel`) for ``dtype``."""
    from . import kernels as tk
    fn = tk.splitk_reduce_kernel
    sig = {"ws_ptr": "*fp32", "out_ptr": "*" + dtype, "NUMEL": "i32", "NSPL": "i32", "BLOCK": "constexpr"}
    attrs = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
    return fn, sig, {"BLOCK": _REDUCE_BLOCK}, {"num_warps": 4, "num_stages": 1, "attrs": attrs}


def _planned_sms(k) -> int:
    """SMs / CUs a stream-K grid is sized for: the ArchSpec's of a KernelKey's arch, else those the
    tuned lists were planned for (a config or a name says no arch; so does an arch not installed)."""
    from ...heuristics import plan_facts

    arch = getattr(k, "arch", None)
    if isinstance(arch, str):
        from ck_core.plugins import get_manager

        arch = get_manager().archs().get(arch)
    return plan_facts(arch if arch is not None and not isinstance(arch, str) else None)[0]


def _as_config(k) -> ConvKernelConfig:
    if isinstance(k, ConvKernelConfig):
        return k
    if isinstance(k, str):
        return ConvKernelConfig.from_name(k)
    name = getattr(k, "name", None)
    if isinstance(name, str):
        return ConvKernelConfig.from_name(name)
    raise InvalidProblem(f"cannot make a conv kernel config from {k!r}; pass a ConvKernelConfig or its name")
