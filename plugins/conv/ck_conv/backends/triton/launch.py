"""Launch the Triton conv kernels on torch tensors, and describe them for AOT builds.

``run(problem, tensors, config=None)`` takes the operands of the problem's
direction (``x``/``w`` forward, ``dy``/``w`` bwd_data, ``x``/``dy`` bwd_weight)
as torch tensors in the problem's layouts and returns the result in the
problem's layout.  Tensors of the ``nhwgc`` family go straight to the kernels;
others are transposed to channels-last first (a copy).

The AOT descriptions of the same kernels (``kernel_for``, ``aot_signature``,
``aot_source_args``) are :mod:`.aot`'s.
"""
from __future__ import annotations

import contextvars

from ck_core.dtypes import torch_dtype
from ck_core.errors import InvalidProblem, UnsupportedProblem

from ...geometry import _cdiv, _class_rows, _residue_table, geometry, streamk_programs, tma_blocks
from ...keys import ConvKernelConfig
from ...problem import _FLT, _IMG, ConvProblem


# ---------------------------------------------------------------------------
# layouts
# ---------------------------------------------------------------------------

def _cl_order(kind: str, nd: int) -> str:
    return {"in": "N" + _IMG[nd] + "GC", "out": "N" + _IMG[nd] + "GK", "wei": "GK" + _FLT[nd] + "C"}[kind]


def to_channels_last(t, layout: str, kind: str, nd: int):
    """A contiguous channels-last (NDHWGC / GKZYXC / NDHWGK order) view or copy of ``t``."""
    order = _cl_order(kind, nd)
    if layout != order:
        t = t.permute(*[layout.index(ch) for ch in order])
    return t.contiguous()


def from_channels_last(t, layout: str, kind: str, nd: int):
    order = _cl_order(kind, nd)
    if layout == order:
        return t
    return t.permute(*[order.index(ch) for ch in layout]).contiguous()


# ---------------------------------------------------------------------------
# bwd_data: which taps reach each stride residue class
# ---------------------------------------------------------------------------

def _linear_rows(rows, Ho, Wo):
    """Table rows (tap, od, oh, ow, (od*Ho + oh)*Wo + ow) for the kernel."""
    return [[(t, a, b, c, (a * Ho + b) * Wo + c) for (t, a, b, c) in row] for row in rows]


_TABLES: dict = {}


def _table_tensor(rows, T, device, extra=None):
    """Device copies of a residue table, cached so that launches inside CUDA-graph capture copy nothing."""
    key = (id(rows), T, str(device), extra)
    hit = _TABLES.get(key)
    if hit is not None and hit[0] is rows:
        _note("keep", hit[1])
        _note("keep", hit[2])
        return hit[1], hit[2]
    import torch
    tab = torch.zeros((len(rows), T, 5), dtype=torch.int32)
    cnt = torch.zeros((len(rows),), dtype=torch.int32)
    for r, row in enumerate(rows):
        cnt[r] = len(row)
        for j, e in enumerate(row):
            tab[r, j] = torch.tensor(e if len(e) == 5 else (*e, (e[1] * extra[0] + e[2]) * extra[1] + e[3]),
                                     dtype=torch.int32)
    tab, cnt = tab.to(device), cnt.to(device)
    _TABLES[key] = (rows, tab, cnt)
    _note("keep", tab)
    _note("keep", cnt)
    return tab, cnt


def _ctab_tensor(rows, device):
    """Device copy of a class table (cached: launches inside CUDA-graph capture copy nothing)."""
    key = ("ctab", id(rows), str(device))
    hit = _TABLES.get(key)
    if hit is not None and hit[0] is rows:
        _note("keep", hit[1])
        return hit[1]
    import torch
    t = torch.tensor([list(r) for r in rows], dtype=torch.int32).reshape(-1).to(device)
    _TABLES[key] = (rows, t)
    _note("keep", t)
    return t


# ---------------------------------------------------------------------------
# launching
# ---------------------------------------------------------------------------



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


_PIX: dict = {}


def pixel_tables(p: ConvProblem, device, tap_bits: bool = False):
    """(base, packed coords) int32 tables over output pixels for bwd_weight, or None
    when a coordinate does not fit the 10-bit packing (the kernel then divides).

    ``tap_bits``: the second table holds, per output pixel, bit t set where filter
    tap t reads inside the image (filters of at most 31 taps), so the kernel's
    row mask is a shift and an and; no packing limit then.
    """
    g = geometry(p)
    key = (p.N, tuple(g[k] for k in ("Di", "Hi", "Wi", "Do", "Ho", "Wo")), g["sd"], g["pad"], str(device))
    if tap_bits:
        key += ("bits", g["dil"], g["flt"])
    if key not in _PIX:
        _PIX[key] = _pixel_tables(p, g, device, tap_bits)
    for t in _PIX[key] or ():
        _note("keep", t)   # cached for good: a replay may hold them
    return _PIX[key]


def _pixel_tables(p: ConvProblem, g: dict, device, tap_bits: bool):
    lim = max(g["Di"], g["Hi"], g["Wi"], *(o * s for o, s in zip((g["Do"], g["Ho"], g["Wo"]), g["sd"])))
    if not tap_bits and (lim + max(g["pad"]) >= 511 or max(g["pad"]) > 511):
        return None
    import torch
    P = p.N * g["Do"] * g["Ho"] * g["Wo"]
    q = torch.arange(P, dtype=torch.int64, device=device)
    ow = q % g["Wo"]
    t = q // g["Wo"]
    oh = t % g["Ho"]
    t = t // g["Ho"]
    od = t % g["Do"]
    n = t // g["Do"]
    i0 = od * g["sd"][0] - g["pad"][0]
    i1 = oh * g["sd"][1] - g["pad"][1]
    i2 = ow * g["sd"][2] - g["pad"][2]
    base = (((n * g["Di"] + i0) * g["Hi"] + i1) * g["Wi"] + i2).to(torch.int32)
    if tap_bits:
        if p.taps > 31:
            raise UnsupportedProblem(f"tap bits hold 31 taps; the filter has {p.taps}")
        bits = torch.zeros(P, dtype=torch.int64, device=device)
        (fz_n, fy_n, fx_n), (dd, dh, dw) = g["flt"], g["dil"]
        tap = 0
        for fz in range(fz_n):
            for fy in range(fy_n):
                for fx in range(fx_n):
                    ok = ((i0 + fz * dd >= 0) & (i0 + fz * dd < g["Di"]) & (i1 + fy * dh >= 0)
                          & (i1 + fy * dh < g["Hi"]) & (i2 + fx * dw >= 0) & (i2 + fx * dw < g["Wi"]))
                    bits |= ok.to(torch.int64) << tap
                    tap += 1
        return base, bits.to(torch.int32)
    packed = (((i0 + 512) << 20) | ((i1 + 512) << 10) | (i2 + 512)).to(torch.int32)
    return base, packed


def _num_sms(device) -> int:
    """SMs / CUs of ``device`` from its ArchSpec (the interpreter runs programs one after another:
    any count is right on the CPU)."""
    if device.type == "cuda":
        from ck_core.device import current_arch

        return current_arch(device).compute_units
    return 4


class _StreamK:
    """Output, fp32 partials and counters of a stream-K launch of ``nprog`` programs
    over ``ntiles`` tiles of ``steps`` steps each (kernel args as _SplitOut's)."""

    def __init__(self, final, total: int, steps: int, nprog: int, ntiles: int):
        import torch
        self.final = final
        self.chunk = _cdiv(total, nprog)
        self.nprog = _cdiv(total, self.chunk)
        parts = min(self.nprog, _cdiv(steps, self.chunk) + 1)
        numel = final.numel()
        if parts * numel >= 2 ** 31:
            raise UnsupportedProblem(f"stream-K partials of {parts} x {numel} elements overflow 32-bit offsets; "
                                     f"use a fixup or atomic split reduction for this problem")
        self.out = torch.empty((parts,) + tuple(final.shape), dtype=torch.float32, device=final.device)
        _note("scratch", self.out, False)
        self.fin, self.stride = final, numel
        self.cnt = _counters(final.device, ntiles)
        self.atomic, self.ws = False, 2

    def finish(self):
        return self.final


_COUNTERS: dict = {}
_ACCUM: dict = {}
_REDUCE_BLOCK = 1024


def _counters(device, n: int):
    """Zeroed int32 arrival counters for ``fixup`` reductions (each tile's last program
    resets its counter, so they stay zero between launches).  Shared per device:
    two fixup launches must not run concurrently on different streams."""
    return _persistent(_COUNTERS, "int32", device, n)


def _persistent(cache: dict, dtype: str, device, n: int):
    import torch
    c = cache.get(str(device))
    if c is None or c.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # a buffer from the graph's private pool must not outlive the graph
            raise UnsupportedProblem("fixup/atomicfix reductions size their persistent buffers on the first "
                                     "launch; run the kernel once before capturing it in a CUDA graph")
        c = torch.zeros(max(n, 1 << 16), dtype=getattr(torch, dtype), device=device)
        cache[str(device)] = c
    _note("keep", c)
    return c


def _accumulator(device, n: int):
    """A zeroed fp32 buffer of at least ``n`` elements for ``atomicfix`` reductions (each
    tile's last program zeroes its part again).  Shared per device like the counters."""
    return _persistent(_ACCUM, "float32", device, n)


class _SplitOut:
    """Where a (possibly split) reduction writes, and how it is finished.

    ``out`` goes to the kernel's output pointer, ``fin`` / ``cnt`` / ``stride`` to
    its ``fin_ptr`` / ``cnt_ptr`` / ``WS_STRIDE``; ``atomic`` / ``ws`` are the
    ATOMIC / WS constexprs; :meth:`finish` returns the result in ``final``'s dtype.
    """

    def __init__(self, final, nsplit: int, reduction: str, ntiles: int):
        import torch
        self.final, self.nsplit = final, nsplit
        self.fin, self.cnt, self.stride, self.atomic, self.ws = final, final, 0, False, 0
        if nsplit == 1:
            self.out = final
            return
        numel = final.numel()
        if reduction == "atomicfix":
            self.out = _accumulator(final.device, numel)
            self.ws = 3
            self.cnt = _counters(final.device, ntiles)
            return
        if reduction in ("twostage", "fixup") and nsplit * numel >= 2 ** 31:
            # why_not refuses these: a workspace this size would overflow the kernels' 32-bit offsets
            raise UnsupportedProblem(f"{reduction} workspace of {nsplit} x {numel} elements overflows 32-bit "
                                     f"offsets; use an atomic split reduction")
        if reduction in ("atomic", "relaxed"):
            self.out = torch.zeros(final.shape, dtype=torch.float32, device=final.device)
            _note("scratch", self.out, True)
            self.atomic = 2 if reduction == "relaxed" else True
            return
        self.out = torch.empty((nsplit,) + tuple(final.shape), dtype=torch.float32, device=final.device)
        _note("scratch", self.out, False)
        self.stride = numel
        if reduction == "fixup":
            self.ws = 2
            self.cnt = _counters(final.device, ntiles)
        else:
            self.ws = 1

    def finish(self):
        if self.nsplit == 1 or self.ws in (2, 3):
            return self.final
        if self.atomic:
            _note("converted", self.out, self.final.dtype)
            return self.out if self.out.dtype == self.final.dtype else self.out.to(self.final.dtype)
        from . import kernels as tk
        numel = self.final.numel()
        _k(tk.splitk_reduce_kernel, (_cdiv(numel, _REDUCE_BLOCK),))(self.out, self.final, numel, self.nsplit,
                                                                BLOCK=_REDUCE_BLOCK, num_warps=4)
        return self.final


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


#: host-expanded weight tables of ``_rows_wexp`` launches: id(w) -> (w, w._version, Wo, table);
#: the weight tensor is held so that its id and storage cannot be reused while cached
_WEXP: dict = {}
_WEXP_MAX = 8


def _wexp_table(w, wc, T: int, G: int, Wo: int):
    """[T, Wo*G] table with table[t, ow*G + g] = wc[g, t] (wc: the channels-last [G, 1, ..., 1]
    depthwise weights made from the caller's ``w``), cached per ``w`` and its in-place version (weights are
    usually static; a modified or different tensor builds a new table)."""
    e = _WEXP.get(id(w))
    if e is not None and e[0] is w and e[1] == w._version and e[2] == Wo:
        return e[3]
    tab = wc.reshape(G, T).t().unsqueeze(1).expand(T, Wo, G).contiguous()
    if len(_WEXP) >= _WEXP_MAX:
        _WEXP.pop(next(iter(_WEXP)))
    _WEXP[id(w)] = (w, w._version, Wo, tab)
    return tab


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


#: (kernel key name, its compile options, a capture list or None) of the running launch
_KERNEL = contextvars.ContextVar("ck_conv_kernel", default=("conv", None, None))


def _k(fn, grid):
    """``fn[grid]`` with the kernel from the kernel cache, under the running key's name
    (``<key name>/<function>``; :mod:`ck_core.backends.triton_artifacts`)."""
    from ck_core.backends import triton_artifacts

    name, extra, jit_capture = _KERNEL.get()
    suffix = f"/{getattr(fn, '__name__', 'kernel')}"
    if jit_capture is not None:   # ck build's jit_calls: record the launch, run nothing
        return lambda *args, **kwargs: jit_capture.append((suffix, fn, args, kwargs))
    name = name + suffix
    cap = _CAPTURE.get()
    if cap is not None:
        return lambda *args, **kwargs: cap.launch(name, fn, grid, args, kwargs, extra)
    return triton_artifacts.bind(name, fn, grid, extra)


#: the :class:`Capture` of the running launch, if one is being recorded
_CAPTURE = contextvars.ContextVar("ck_conv_capture", default=None)


class Capture:
    """The launches of one :func:`run` as replays, and the tensors they took in their roles.

    :func:`run` under :meth:`recording` launches through :func:`ck_core.backends.triton_replay.record`
    and names its operands (``x``/``w``/``y`` of a forward: channels-last input, weights,
    output buffer).  :meth:`replayer` turns that into a closure for later calls of the
    same problem on tensors with the same shapes, strides, dtype, device and alignment.
    """

    def __init__(self):
        self.launches, self.roles, self.ok = [], {}, True
        self.fresh, self.kept, self.convert = {}, {}, None

    def scratch(self, t, zero: bool):
        """``t`` is a buffer each launch needs anew (zeroed when ``zero``)."""
        role = f"s{len(self.fresh)}"
        self.roles[role], self.fresh[role] = t, zero

    def keep(self, t):
        """``t`` is a persistent buffer (counters, accumulators) every launch shares."""
        self.kept[t.data_ptr()] = t

    def converted(self, src, dtype):
        """The result is ``src`` (a scratch buffer) converted to ``dtype``."""
        self.convert = (src.data_ptr(), dtype)

    def launch(self, name, fn, grid, args, kwargs, extra):
        from ck_core.backends import triton_replay

        r = triton_replay.record(fn, grid, list(args), kwargs, name=name, extra=extra)
        if r is None:
            self.ok = False   # launched, but nothing to replay
        else:
            self.launches.append(r)

    def recording(self):
        return _Recording(self)

    def replayer(self, p: ConvProblem, out):
        """``f(a, b) -> out`` (the direction's two operands in ``IN_NAMES`` order and its result,
        in the problem's layouts), or None where a launch took a tensor that is not one of the
        roles or kept buffers (workspaces, copies the replay would not redo).  Roles: ``x`` / ``w``
        the channels-last first / second operand, ``y`` the output buffer (``_ROLE_KINDS``)."""
        import torch
        roles = self.roles
        if not self.ok or not self.launches or not {"x", "w", "y"} <= set(roles):
            return None
        where = {t.data_ptr(): role for role, t in roles.items()}
        if len(where) != len(roles) or set(where) & set(self.kept):
            return None
        conv = None
        if self.convert is not None:
            conv = (where.get(self.convert[0]), self.convert[1])
            if conv[0] not in self.fresh:
                return None
        elif out.data_ptr() != roles["y"].data_ptr() and not _is_layout_copy(out, roles["y"], p):
            return None
        (ka, kb), ky = _ROLE_KINDS[p.direction]
        lay = {"in": p.in_layout, "wei": p.wei_layout, "out": p.out_layout}
        plan = []
        for r in self.launches:
            args, slots = list(r.args), []
            for i, v in enumerate(args):
                # a tensor descriptor: a recorded Replay holds its base tensor, a plain record the
                # descriptor itself (rebuilt per call around the role's tensor)
                desc = None if isinstance(v, torch.Tensor) else v
                t = v if desc is None else getattr(v, "base", None)
                if isinstance(t, torch.Tensor) and t.data_ptr() not in self.kept:
                    role = where.get(t.data_ptr())
                    if role is None:
                        return None
                    if desc is not None:   # the base as the descriptor saw it (often a reshape of the role's)
                        desc = (_with_base(desc, None), tuple(t.shape), tuple(t.stride()))
                    slots.append((i, role, desc))
                    args[i] = None   # the recorded tensors are not kept alive
            r.args = args
            plan.append((r, args, tuple(slots)))
        fresh = tuple((role, tuple(roles[role].shape), roles[role].dtype, torch.zeros if zero else torch.empty)
                      for role, zero in self.fresh.items())
        nd = p.ndim
        px = _perm(lay[ka], ka, nd)
        pw = _perm(lay[kb], kb, nd)
        order = _cl_order(ky, nd)
        po = None if lay[ky] == order else [order.index(ch) for ch in lay[ky]]
        y = roles["y"]
        shape, dtype, dev = tuple(y.shape), y.dtype, y.device
        from ck_core.warm import contiguous_strides

        stride, empty_strided = contiguous_strides(shape), torch.empty_strided
        # a split's fp32 result converted into the output buffer the launch was given anyway
        # (as .to() would convert it, without allocating another tensor)
        into_y = (conv is not None and conv[1] == dtype and roles[conv[0]].dtype != dtype
                  and tuple(roles[conv[0]].shape) == shape)

        def replay(x, w):
            vals = {"x": x if px is None else x.permute(px).contiguous(),
                    "w": w if pw is None else w.permute(pw).contiguous(),
                    "y": empty_strided(shape, stride, dtype=dtype, device=dev)}
            for role, sh, dt, new in fresh:
                vals[role] = new(sh, dtype=dt, device=dev)
            for r, args, slots in plan:
                a = args.copy()
                for i, role, desc in slots:
                    # pointer slots and a Replay's descriptor slots read the data pointer alone
                    a[i] = vals[role] if desc is None else _with_base(desc[0], vals[role].as_strided(desc[1], desc[2]))
                r(a)
            if conv is None:
                y = vals["y"]
            elif into_y:
                y = vals["y"].copy_(vals[conv[0]])
            else:
                y = vals[conv[0]].to(conv[1])
            return y if po is None else y.permute(po).contiguous()

        # only the operands' data pointers are read: any tensor with the same memory will do
        replay.pointers_only = px is None and pw is None
        return replay


class _Recording:
    def __init__(self, cap):
        self.cap = cap

    def __enter__(self):
        self.token = _CAPTURE.set(self.cap)
        return self.cap

    def __exit__(self, *exc):
        _CAPTURE.reset(self.token)


def _with_base(desc, base):
    """A copy of the tensor descriptor ``desc`` around ``base`` (same shape, strides and block)."""
    d = object.__new__(type(desc))
    d.__dict__.update(desc.__dict__)
    d.base = base
    return d


def _note(what: str, *args) -> None:
    """Tell the running :class:`Capture`, if any, what a buffer is (``Capture.<what>(*args)``)."""
    cap = _CAPTURE.get()
    if cap is not None:
        getattr(cap, what)(*args)


def _perm(layout: str, kind: str, nd: int):
    """The permutation :func:`to_channels_last` applies to ``layout`` (None: none, no copy)."""
    order = _cl_order(kind, nd)
    return None if layout == order else [layout.index(ch) for ch in order]


#: per direction: the layout kinds of the two operands (IN_NAMES order) and of the result
_ROLE_KINDS = {"forward": (("in", "wei"), "out"), "bwd_data": (("out", "wei"), "in"),
               "bwd_weight": (("in", "out"), "wei")}


def _is_layout_copy(out, y, p: ConvProblem) -> bool:
    """Whether ``out`` is what :func:`from_channels_last` made of ``y`` (not a workspace's reduction)."""
    ky = _ROLE_KINDS[p.direction][1]
    lay = {"in": p.in_layout, "wei": p.wei_layout, "out": p.out_layout}[ky]
    return lay != _cl_order(ky, p.ndim) and out.numel() == y.numel() and out.dtype == y.dtype


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
        xc = to_channels_last(x, p.in_layout, "in", nd)
        wc = to_channels_last(w, p.wei_layout, "wei", nd)
        M = p.N * g["Do"] * g["Ho"] * g["Wo"]
        y = torch.empty((p.N,) + p.output_spatial + (G, K), dtype=x.dtype, device=x.device)
        cap = _CAPTURE.get()
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
        return from_channels_last(y, p.out_layout, "out", nd)

    if p.direction == "bwd_data":
        dy, w = tensors["dy"], tensors["w"]
        p.check_shapes(y=dy, w=w)
        _check(p, dy=dy, w=w)
        dyc = to_channels_last(dy, p.out_layout, "out", nd)
        wc = to_channels_last(w, p.wei_layout, "wei", nd)
        dx = torch.empty((p.N,) + p.input_spatial + (G, C), dtype=dy.dtype, device=dy.device)
        cap = _CAPTURE.get()
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
        return from_channels_last(dx, p.in_layout, "in", nd)

    # bwd_weight
    x, dy = tensors["x"], tensors["dy"]
    p.check_shapes(x=x, y=dy)
    _check(p, x=x, dy=dy)
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
    shape = (G, K) + p.filter + (C,)
    final = torch.empty(shape, dtype=x.dtype, device=x.device)
    cap = _CAPTURE.get()
    if cap is not None:
        cap.roles.update(x=xc, w=dyc, y=final)
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
    return from_channels_last(out, p.wei_layout, "wei", nd)
