"""Launch the Triton conv kernels on torch tensors, and describe them for AOT builds.

``run(problem, tensors, config=None)`` takes the operands of the problem's
direction (``x``/``w`` forward, ``dy``/``w`` bwd_data, ``x``/``dy`` bwd_weight)
as torch tensors in the problem's layouts and returns the result in the
problem's layout.  Tensors of the ``nhwgc`` family go straight to the kernels;
others are transposed to channels-last first (a copy).

The AOT descriptions of the same kernels (``kernel_for``, ``aot_signature``,
``aot_source_args``) are :mod:`.aot`'s; the buffers a launch takes beside its operands
(split outputs, workspaces, cached tables) :mod:`.buffers`'; how a launch reaches its kernel
and the recording of a run for warm calls :mod:`.warm`'s.
"""
from __future__ import annotations

from ck_core.dtypes import torch_dtype
from ck_core.errors import InvalidProblem, UnsupportedProblem

from ...geometry import (_cdiv, _class_rows, _residue_table, from_channels_last, geometry, streamk_programs,
                         tma_blocks, to_channels_last)
from ...keys import ConvKernelConfig
from ...problem import ConvProblem
# _ACCUM, _COUNTERS, _REDUCE_BLOCK: not used here, read through this module by aot.py and the tests
from .buffers import (_ACCUM, _COUNTERS, _REDUCE_BLOCK, _SplitOut, _StreamK, _accumulator,  # noqa: F401
                      _counters, _ctab_tensor, _table_tensor, _wexp_table, pixel_tables)
from .warm import _CAPTURE, _KERNEL, _k


def _check(p: ConvProblem, **tensors):
    import torch
    want = torch_dtype(p.dtype)
    for name, t in tensors.items():
        if t.dtype != want:
            raise InvalidProblem(f"{name} is {t.dtype} but the problem is {p.dtype}; convert it with .to({want})")
        if t.numel() >= 2 ** 31:
            raise UnsupportedProblem(f"{name} has {t.numel()} elements; the Triton kernels index with 32-bit "
                                     f"offsets, split the batch below 2**31 elements per tensor")
    devs = {t.device for t in tensors.values()}
    if len(devs) > 1:
        raise InvalidProblem(f"operands live on different devices {sorted(map(str, devs))}; move them to one")


def _num_sms(device) -> int:
    """SMs / CUs of ``device`` from its ArchSpec (the interpreter runs programs one after another:
    any count is right on the CPU)."""
    if device.type == "cuda":
        from ck_core.device import current_arch

        return current_arch(device).compute_units
    return 4


def _flat_args(p: ConvProblem, g: dict, bwd: bool):
    """(R, Dd, Hd, Wd, Ds, Hs, Ws, a, b, c, s) of ``dw_flat_kernel`` (see _dw_src):
    destination rows and sizes, source sizes, per-dimension coefficients."""
    out_sp, in_sp = (g["Do"], g["Ho"], g["Wo"]), (g["Di"], g["Hi"], g["Wi"])
    dst, src = (in_sp, out_sp) if bwd else (out_sp, in_sp)
    if bwd:
        a, b, c, s = (1, 1, 1), g["pad"], tuple(-d for d in g["dil"]), g["sd"]
    else:
        a, b, c, s = g["sd"], tuple(-x for x in g["pad"]), g["dil"], (1, 1, 1)
    R = p.N * dst[0] * dst[1]
    return R, dst, src, a, b, c, s


def _dw_flat(src, w, dst, p: ConvProblem, g: dict, meta: dict, nw: int, ns: int, bwd: bool):
    """Launch ``dw_flat_kernel``: dst (channels-last) from src and the weights."""
    from . import kernels as tk
    R, dsz, ssz, a, b, c, s = _flat_args(p, g, bwd)
    G = p.G
    grid = (_cdiv(dsz[2] * G, meta["BLOCK_F"]) * _cdiv(R, meta["BLOCK_R"]),)
    _k(tk.dw_flat_kernel, grid)(src, w, dst, R, G, *dsz, *ssz, src.numel(), *a, *b, *c, *s, *g["flt"], **meta,
                            UNIT_W=a[2] == 1 and s[2] == 1, BWD=bwd, num_warps=nw, num_stages=ns)


def _rows_args(p: ConvProblem, g: dict):
    """(G, Hi, Ho, WGI, WGO, ph, pw) of the row-reuse kernel (rows = N*Di: D is unpadded, 1-deep)."""
    return (p.G, g["Hi"], g["Ho"], g["Wi"] * p.G, g["Wo"] * p.G, g["pad"][1], g["pad"][2])


def _rows_grid(p: ConvProblem, g: dict, block: int, rh: int) -> tuple:
    return (_cdiv(g["Wo"] * p.G, block), _cdiv(g["Ho"], rh), p.N * g["Di"])


def _dw_rows(x, w, wc, y, p: ConvProblem, g: dict, meta: dict, nw: int, ns: int):
    """Launch the row-reuse depthwise forward kernel (ck_conv.backends.triton.dw_codegen.render_rows)."""
    from .dw_codegen import dw_fwd_rows_kernel
    rh, fy, fx = meta.pop("RH"), g["flt"][1], g["flt"][2]
    wt = _wexp_table(w, wc, fy * fx, p.G, g["Wo"]) if meta["WEXP"] else wc
    grid = _rows_grid(p, g, meta["BLOCK"], rh)
    _k(dw_fwd_rows_kernel(rh, fy, fx), grid)(x, wt, y, *_rows_args(p, g), **meta, num_warps=nw, num_stages=ns)


def _split_as_named(cfg: ConvKernelConfig, nsplit: int) -> int:
    """The launch's split, which must be the kernel's (``why_not`` refuses the others)."""
    if nsplit != cfg.split:
        raise UnsupportedProblem(f"kernel {cfg.name} splits {cfg.split} ways but this problem's reduction "
                                 f"leaves {nsplit} non-empty parts; pick a kernel that supports it")
    return nsplit


def run(p: ConvProblem, tensors: dict, config: ConvKernelConfig | str, num_sms: int | None = None,
        kernel_name: str | None = None, compile_options: dict | None = None, capture: list | None = None):
    """Compute ``p`` on torch tensors with exactly the Triton kernel ``config`` (a config or its name).

    The kernel's ``split`` cuts the reduction over that many programs, combined as
    its ``reduction`` says (see ck_conv.keys.REDUCTIONS); ``streamk`` runs a
    persistent grid of ``split`` programs per SM.  Nothing here chooses a kernel, a
    split or a reduction: a config that cannot run ``p`` as named raises
    UnsupportedProblem (the Dispatcher's ``supports()`` holds the same reasons).
    ``num_sms``: the SM/CU count stream-K grids are sized for (the Dispatcher passes
    the ArchSpec's ``compute_units``); None reads the device's.
    ``fixup`` / ``atomicfix`` keep per-device arrival counters (and, atomicfix,
    an fp32 accumulator) that their launches leave zeroed: do not run two such
    launches concurrently on different streams.
    ``kernel_name``: the kernel key's name, under which its kernels are cached
    (default: the config's name); ``compile_options``: the key's extra compile options
    (``ck_core.backends.triton_artifacts.compile_options``), part of the cache entry;
    ``capture``: append each launch to it as ``(suffix, fn, args, kwargs)`` instead of running it
    (``ck build``'s representative calls, :func:`ck_conv.backends.triton.keys.jit_calls`).
    """
    name = kernel_name or (config if isinstance(config, str) else getattr(config, "name", "conv"))
    token = _KERNEL.set((name, compile_options or None, capture))
    try:
        return _run(p, tensors, config, num_sms)
    finally:
        _KERNEL.reset(token)


def _run(p: ConvProblem, tensors: dict, config, num_sms):
    import torch
    from . import kernels as tk

    need = p.input_names()
    if any(n not in tensors or not isinstance(tensors[n], torch.Tensor) for n in need):
        bad = {n: type(tensors[n]).__name__ for n in need if n in tensors and not isinstance(tensors[n], torch.Tensor)}
        raise InvalidProblem(f"{p.direction} conv takes torch tensors {', '.join(need)}; "
                             + (f"missing {', '.join(n for n in need if n not in tensors)}" if not bad else
                                f"got {', '.join(f'{n}: {t}' for n, t in bad.items())}"))
    if config is None:
        raise InvalidProblem("run: config is required (a ConvKernelConfig or its name); ck_conv.conv2d and "
                             "the Dispatcher choose one")
    cfg = ConvKernelConfig.from_name(config) if isinstance(config, str) else config
    why = cfg.why_not(p)
    if why:
        raise UnsupportedProblem(f"kernel {cfg.name} cannot run this problem: {why}; pick another kernel "
                                 f"(the Dispatcher picks one that supports it)")
    split = cfg.split
    nd = p.ndim
    g = geometry(p)
    meta = cfg.triton_meta()
    nw, ns = meta.pop("num_warps"), meta.pop("num_stages")
    if next(iter(tensors.values())).device.type == "cpu":
        ns = 1  # interpreter: no pipelining
    sd, pad, dil, flt = g["sd"], g["pad"], g["dil"], g["flt"]
    G, C, K = p.G, g["C"], g["K"]
    ieee = 1 if p.dtype == "fp32" else 0
    if p.dtype == "bf16" and next(iter(tensors.values())).device.type == "cpu":
        ieee = 2
    dwise = cfg.specialization == "depthwise"

    if p.direction == "forward":
        x, w = tensors["x"], tensors["w"]
        p.check_shapes(x=x, w=w)
        _check(p, x=x, w=w)
        M = p.N * g["Do"] * g["Ho"] * g["Wo"]
        cap = _CAPTURE.get()
        if meta.get("NCHW"):   # the implicit-GEMM kernels read NGCHW / GKCYX and write NGKHW in place
            xc, wc = x.contiguous(), w.contiguous()   # no copy for torch's default (contiguous) tensors
            y = torch.empty((p.N, G, K) + p.output_spatial, dtype=x.dtype, device=x.device)
            if cap is not None:
                cap.direct = True
        else:   # the depthwise kernels read and write channels-last only: NCHW operands are copied
            xc = to_channels_last(x, p.in_layout, "in", nd)
            wc = to_channels_last(w, p.wei_layout, "wei", nd)
            y = torch.empty((p.N,) + p.output_spatial + (G, K), dtype=x.dtype, device=x.device)
        if cap is not None:
            cap.roles.update(x=xc, w=wc, y=y)
        if cfg.flat and not dwise:   # im2col over the flattened (tap, channel) reduction
            grid = (_cdiv(M, meta["BLOCK_M"]) * _cdiv(K, meta["BLOCK_N"]), G)
            _k(tk.conv_fwd_flat_kernel, grid)(xc, wc, y, M, g["Di"], g["Hi"], g["Wi"], g["Do"], g["Ho"], g["Wo"],
                                          C, K, G * C, G * K, *sd, *pad, *dil, *flt, **meta, IEEE=ieee,
                                          num_warps=nw, num_stages=ns)
        elif dwise and cfg.rows:
            _dw_rows(xc, w, wc, y, p, g, dict(meta, RH=cfg.tile[0]), nw, ns)
        elif dwise and cfg.flat:
            _dw_flat(xc, wc, y, p, g, meta, nw, ns, bwd=False)
        elif dwise:
            grid = (_cdiv(M, meta["BLOCK_P"]), _cdiv(G, meta["BLOCK_G"]))
            _k(tk.dw_fwd_kernel, grid)(xc, wc, y, M, G, g["Di"], g["Hi"], g["Wi"], g["Do"], g["Ho"], g["Wo"],
                                   *sd, *pad, *dil, *flt, **meta, num_warps=nw, num_stages=ns)
        else:
            gm = meta["GM"]  # groups merged into one block-diagonal GEMM
            Gb = G // gm
            tiles = _cdiv(M, meta["BLOCK_M"]) * _cdiv(K * gm, meta["BLOCK_N"])
            steps = (p.taps if meta["SPEC"] != 1 else 1) * _cdiv(C * gm, meta["BLOCK_K"])
            if cfg.reduction == "streamk":
                total = tiles * Gb * steps
                so = _StreamK(y, total, steps, streamk_programs(cfg, total, steps, (num_sms or _num_sms(x.device)), split),
                              tiles * Gb)
                grid, chunk = (so.nprog, 1, 1), so.chunk
            else:
                chunk = _cdiv(steps, split)
                nsplit = _split_as_named(cfg, _cdiv(steps, chunk))
                so = _SplitOut(y, nsplit, cfg.reduction, tiles * Gb)
                grid = (tiles, Gb, nsplit)
            _k(tk.conv_fwd_kernel, grid)(
                xc, wc, so.out, so.fin, so.cnt, M, g["Di"], g["Hi"], g["Wi"], g["Do"], g["Ho"], g["Wo"],
                C, K, G * C, G * K, *sd, *pad, *dil, *flt, chunk, so.stride, **meta,
                EVEN_C=C * gm % meta["BLOCK_K"] == 0, IEEE=ieee, ATOMIC=so.atomic, WS=so.ws, num_warps=nw,
                num_stages=ns)
            y = so.finish()
        return y if meta.get("NCHW") else from_channels_last(y, p.out_layout, "out", nd)

    if p.direction == "bwd_data":
        dy, w = tensors["dy"], tensors["w"]
        p.check_shapes(y=dy, w=w)
        _check(p, dy=dy, w=w)
        cap = _CAPTURE.get()
        if meta.get("NCHW"):   # the implicit-GEMM kernels read NGKHW / GKCYX and write NGCHW in place
            dyc, wc = dy.contiguous(), w.contiguous()   # no copy for torch's default (contiguous) tensors
            dx = torch.empty((p.N, G, C) + p.input_spatial, dtype=dy.dtype, device=dy.device)
            if cap is not None:
                cap.direct = True
        else:   # the depthwise kernels read and write channels-last only: NCHW operands are copied
            dyc = to_channels_last(dy, p.out_layout, "out", nd)
            wc = to_channels_last(w, p.wei_layout, "wei", nd)
            dx = torch.empty((p.N,) + p.input_spatial + (G, C), dtype=dy.dtype, device=dy.device)
        if cap is not None:
            cap.roles.update(x=dyc, w=wc, y=dx)
        if dwise and cfg.flat:
            _dw_flat(dyc, wc, dx, p, g, meta, nw, ns, bwd=True)
        elif dwise:
            Mi = p.N * g["Di"] * g["Hi"] * g["Wi"]
            grid = (_cdiv(Mi, meta["BLOCK_P"]), _cdiv(G, meta["BLOCK_G"]))
            _k(tk.dw_bwd_data_kernel, grid)(dyc, wc, dx, Mi, G, g["Di"], g["Hi"], g["Wi"], g["Do"], g["Ho"], g["Wo"],
                                        *sd, *pad, *dil, *flt, **meta, num_warps=nw, num_stages=ns)
        elif "STREAMK" in meta:  # the counter-driven kernel: tap bits and/or stream-K
            crow = _class_rows(sd, pad, dil, flt, g["Ho"], g["Wo"])
            ctab = _ctab_tensor(crow, dy.device)
            tmax = max(r[0] * r[1] * r[2] for r in crow)
            Rd, Rh, Rw = (_cdiv(a, s_) for a, s_ in zip((g["Di"], g["Hi"], g["Wi"]), sd))
            Mr = p.N * Rd * Rh * Rw
            gm = meta["GM"]
            tiles = _cdiv(Mr, meta["BLOCK_M"]) * _cdiv(C * gm, meta["BLOCK_N"])
            steps = (tmax if meta["SPEC"] != 1 else 1) * _cdiv(K * gm, meta["BLOCK_K"])
            ntiles = tiles * (G // gm) * len(crow)
            if cfg.reduction == "streamk":
                total = ntiles * steps
                so = _StreamK(dx, total, steps, streamk_programs(cfg, total, steps, (num_sms or _num_sms(dy.device)), split),
                              ntiles)
                grid, chunk, nsplit = (so.nprog, 1, 1), so.chunk, 1
            else:
                chunk = _cdiv(max(steps, 1), split)
                nsplit = _split_as_named(cfg, max(1, _cdiv(steps, chunk)))
                so = _SplitOut(dx, nsplit, cfg.reduction, ntiles)
                grid = (tiles, G // gm, len(crow) * nsplit)
            _k(tk.conv_bwd_data_tm_kernel, grid)(dyc, wc, so.out, ctab, so.fin, so.cnt, Mr, Rd, Rh, Rw,
                                             g["Di"], g["Hi"], g["Wi"], g["Do"], g["Ho"], g["Wo"], C, K, G * C,
                                             G * K, p.taps, tmax, *sd, chunk, nsplit, so.stride, **meta,
                                             EVEN_K=K * gm % meta["BLOCK_K"] == 0, IEEE=ieee, ATOMIC=so.atomic,
                                             WS=so.ws, num_warps=nw, num_stages=ns)
            dx = so.finish()
        else:
            T = p.taps
            rows = _residue_table(sd, pad, dil, flt)
            tab, cnt = _table_tensor(rows, T, dy.device, (g["Ho"], g["Wo"]))
            Rd, Rh, Rw = (_cdiv(a, s) for a, s in zip((g["Di"], g["Hi"], g["Wi"]), sd))
            Mr = p.N * Rd * Rh * Rw
            tiles = _cdiv(Mr, meta["BLOCK_M"]) * _cdiv(C, meta["BLOCK_N"])
            steps = max(len(r) for r in rows) * _cdiv(K, meta["BLOCK_K"])
            chunk = _cdiv(max(steps, 1), split)
            nsplit = _split_as_named(cfg, max(1, _cdiv(steps, chunk)))
            so = _SplitOut(dx, nsplit, cfg.reduction, tiles * G * len(rows))
            grid = (tiles, G, len(rows) * nsplit)
            _k(tk.conv_bwd_data_kernel, grid)(dyc, wc, so.out, tab, cnt, so.fin, so.cnt, Mr, Rd, Rh, Rw,
                                          g["Di"], g["Hi"], g["Wi"], g["Do"], g["Ho"], g["Wo"], C, K, G * C, G * K,
                                          T, T, *sd, chunk, nsplit, so.stride, **meta,
                                          EVEN_K=K % meta["BLOCK_K"] == 0, IEEE=ieee, ATOMIC=so.atomic, WS=so.ws,
                                          num_warps=nw, num_stages=ns)
            dx = so.finish()
        return dx if meta.get("NCHW") else from_channels_last(dx, p.in_layout, "in", nd)

    # bwd_weight
    x, dy = tensors["x"], tensors["dy"]
    p.check_shapes(x=x, y=dy)
    _check(p, x=x, dy=dy)
    if meta.get("NCHW"):   # the per-tap kernel reads NGCHW x / NGKHW dy and writes GKCYX dw in place
        xc, dyc = x.contiguous(), dy.contiguous()   # no copy for torch's default (contiguous) tensors
    else:   # the depthwise, tensor-descriptor, im2col and merged-group kernels read channels-last only
        xc = to_channels_last(x, p.in_layout, "in", nd)
        dyc = to_channels_last(dy, p.out_layout, "out", nd)
    P = p.N * g["Do"] * g["Ho"] * g["Wo"]
    if dwise:
        from .dw_codegen import dw_bwd_weight_kernel
        nblk = _cdiv(P, meta["BLOCK_P"])
        split = _split_as_named(cfg, min(split, nblk))
        grid = (_cdiv(G, meta["BLOCK_G"]), split)
        if meta["WS"] == 3:   # atomicfix: persistent zeroed sums, the last program casts them out
            ws = _accumulator(x.device, G * p.taps)
            cnt = _counters(x.device, grid[0])
            fin = torch.empty((G, p.taps), dtype=x.dtype, device=x.device)
        else:
            ws = torch.zeros((G, p.taps), dtype=torch.float32, device=x.device)
            cnt = fin = ws   # unused
        _k(dw_bwd_weight_kernel(flt), grid)(xc, dyc, ws, fin, cnt, P, nblk, G, g["Di"], g["Hi"], g["Wi"], g["Do"],
                                        g["Ho"], g["Wo"], *sd, *pad, *dil, **meta, num_warps=nw, num_stages=ns)
        dwc = (fin if meta["WS"] == 3 else ws.to(x.dtype)).reshape((G, 1) + p.filter + (1,))
        return from_channels_last(dwc, p.wei_layout, "wei", nd)
    if cfg.tma:    # dy and the tap-shifted x blocks as TMA boxes
        from triton.tools.tensor_descriptor import TensorDescriptor

        bm, bn, bk = cfg.tile
        nblk, nwb = tma_blocks(cfg, p)
        split = _split_as_named(cfg, min(split, nblk))
        for t in (xc, dyc):
            if t.data_ptr() % 16:
                raise UnsupportedProblem("the tensor-descriptor kernel needs 16-byte aligned x and dy; pass "
                                         "freshly allocated tensors or pick another kernel")
        if meta["LINEAR"]:
            xv, dyv = xc.reshape(-1, G * C), dyc.reshape(-1, G * K)
            xb, dyb = [bk, bn], [bk, bm]
        else:
            xv = xc.reshape(p.N, g["Di"], g["Hi"], g["Wi"], G * C)
            dyv = dyc.reshape(p.N, g["Do"], g["Ho"], g["Wo"], G * K)
            xb, dyb = [1, 1, 1, bk, bn], [1, 1, 1, bk, bm]
        xd = TensorDescriptor(xv, list(xv.shape), list(xv.stride()), xb)
        dyd = TensorDescriptor(dyv, list(dyv.shape), list(dyv.stride()), dyb)
        final = torch.empty((G, K) + p.filter + (C,), dtype=x.dtype, device=x.device)
        cap = _CAPTURE.get()
        if cap is not None:   # descriptor slots: a replay rebuilds them around the new x and dy
            cap.roles.update(x=xc, w=dyc, y=final)
        grid = (p.taps * _cdiv(K, bm) * _cdiv(C, bn), G, split)
        so = _SplitOut(final, split, cfg.reduction, grid[0] * grid[1])
        _k(tk.conv_bwd_weight_tma_kernel, grid)(
            xd, dyd, so.out, so.fin, so.cnt, nblk, max(nwb, 1), g["Do"], g["Ho"], *pad, *dil, flt[1], flt[2], C, K,
            p.taps, so.stride, **meta, ATOMIC=so.atomic, WS=so.ws, IEEE=ieee, num_warps=nw, num_stages=ns)
        return from_channels_last(so.finish(), p.wei_layout, "wei", nd)
    if cfg.flat:   # im2col over the flattened (tap, channel) columns
        nblk = _cdiv(P, meta["BLOCK_K"])
        split = _split_as_named(cfg, min(split, nblk))
        final = torch.empty((G, K) + p.filter + (C,), dtype=x.dtype, device=x.device)
        cap = _CAPTURE.get()
        if cap is not None:   # plain pointer arguments: a warm call replays these launches
            cap.roles.update(x=xc, w=dyc, y=final)
        grid = (_cdiv(K, meta["BLOCK_M"]) * _cdiv(C * p.taps, meta["BLOCK_N"]), G, split)
        so = _SplitOut(final, split, cfg.reduction, grid[0] * grid[1])
        _k(tk.conv_bwd_weight_flat_kernel, grid)(
            xc, dyc, so.out, so.fin, so.cnt, P, nblk, g["Di"], g["Hi"], g["Wi"], g["Do"], g["Ho"], g["Wo"],
            C, K, G * C, G * K, *sd, *pad, *dil, *flt, so.stride, **meta, ATOMIC=so.atomic, IEEE=ieee, WS=so.ws,
            num_warps=nw, num_stages=ns)
        return from_channels_last(so.finish(), p.wei_layout, "wei", nd)
    bk = meta["BLOCK_K"]
    chunk = _cdiv(_cdiv(P, split), bk) * bk
    split = _split_as_named(cfg, _cdiv(P, chunk))
    shape = (G, K, C) + p.filter if meta.get("NCHW") else (G, K) + p.filter + (C,)
    final = torch.empty(shape, dtype=x.dtype, device=x.device)
    cap = _CAPTURE.get()
    if cap is not None:
        cap.roles.update(x=xc, w=dyc, y=final)
        cap.direct = bool(meta.get("NCHW"))
    gm = meta.get("GM", 1)
    grid = (p.taps * _cdiv(K, meta["BLOCK_M"]) * _cdiv(C, meta["BLOCK_N"]), _cdiv(G, gm), split)
    so = _SplitOut(final, split, cfg.reduction, grid[0] * grid[1])
    bits = cfg.tap_mask and meta["SPEC"] != 1
    tabs = None if meta["SPEC"] == 1 else pixel_tables(p, x.device, tap_bits=bits)
    pb, pc = tabs if tabs is not None else (xc, xc)  # unused when TABLE is off
    geo = (g["Di"], g["Hi"], g["Wi"], g["Do"], g["Ho"], g["Wo"], C, K, G * C, G * K, *sd, *pad, *dil, *flt,
           so.stride)
    flags = dict(ATOMIC=so.atomic, WS=so.ws, IEEE=ieee, FAST_DIV=P < 2 ** 24,
                 TABLE=0 if tabs is None else 2 if bits else 1,
                 num_warps=nw, num_stages=ns)
    if gm > 1:
        _k(tk.conv_bwd_weight_gm_kernel, grid)(xc, dyc, so.out, pb, pc, so.fin, so.cnt, P, chunk, G, *geo, **meta,
                                           **flags)
    else:
        _k(tk.conv_bwd_weight_kernel, grid)(xc, dyc, so.out, pb, pc, so.fin, so.cnt, P, chunk, *geo, **meta, **flags)
    out = so.finish()
    return out if meta.get("NCHW") else from_channels_last(out, p.wei_layout, "wei", nd)
