"""The device buffers a conv launch takes beside its operands.

Where a (split) reduction writes and how it is finished (:class:`_SplitOut`, :class:`_StreamK`),
the per-device arrival counters and fp32 accumulators of ``fixup`` / ``atomicfix`` reductions, and
the host-built tables cached on the device (bwd_data residue and class tables, bwd_weight pixel
tables, expanded depthwise weights) so that launches inside CUDA-graph capture copy nothing.  Each
buffer is noted to a running :class:`.warm.Capture` (scratch or kept).  Buffers kept across calls are
made through :func:`ck_core.memory.persistent`: in no CUDA graph's memory pool, which
``torch.compile(mode="reduce-overhead")`` requires of everything a graph's warm-up leaves alive.
"""
from __future__ import annotations

from ck_core.errors import UnsupportedProblem
from ck_core.memory import persistent

from ...geometry import _cdiv, geometry
from ...problem import ConvProblem
from .warm import _k, _note


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

    def build():
        tab = torch.zeros((len(rows), T, 5), dtype=torch.int32)
        cnt = torch.zeros((len(rows),), dtype=torch.int32)
        for r, row in enumerate(rows):
            cnt[r] = len(row)
            for j, e in enumerate(row):
                tab[r, j] = torch.tensor(e if len(e) == 5 else (*e, (e[1] * extra[0] + e[2]) * extra[1] + e[3]),
                                         dtype=torch.int32)
        return tab.to(device), cnt.to(device)

    tab, cnt = persistent(build, device)
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
    t = persistent(lambda: torch.tensor([list(r) for r in rows], dtype=torch.int32).reshape(-1).to(device), device)
    _TABLES[key] = (rows, t)
    _note("keep", t)
    return t


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
        _PIX[key] = persistent(lambda: _pixel_tables(p, g, device, tap_bits), device)
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
        c = persistent(lambda: torch.zeros(max(n, 1 << 16), dtype=getattr(torch, dtype), device=device), device)
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


#: expanded weight tables of ``_rows_wexp`` launches: w's storage -> (a weak reference to that storage
#: (its identity cannot be reused while held), w's view and in-place version, Wo, table or None: seen once)
_WEXP: dict = {}

_WEXP_MAX = 8


def _wexp_table(w, wc, T: int, G: int, Wo: int):
    """[T, Wo*G] table with table[t, ow*G + g] = wc[g, t] (wc: the channels-last [G, 1, ..., 1]
    depthwise weights made from the caller's ``w``), cached per ``w`` (its storage, view and in-place
    version: weights are usually static; a modified or different tensor builds a new table) from the
    second call that sees it unchanged (a training step's weights change every step: built per call,
    nothing kept), never while a CUDA graph is captured (the graph then builds it on each replay, from
    the weights it reads then).  Kept tables are in no graph's pool (:func:`ck_core.memory.persistent`)
    and hold no reference to ``w``."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef

    def build():
        return wc.reshape(G, T).t().unsqueeze(1).expand(T, Wo, G).contiguous()

    if w.is_cuda and torch.cuda.is_current_stream_capturing():
        return build()
    ref = StorageWeakRef(w.untyped_storage())
    state = (w.storage_offset(), tuple(w.shape), w.stride(), w._version, Wo)
    e = _WEXP.get(ref.cdata)
    if e is not None and not e[0].expired() and e[1] == state:
        if e[2] is not None:
            return e[2]
        tab = persistent(build, wc.device)   # the second call with these weights: kept from here on
    else:
        tab = None
    if len(_WEXP) >= _WEXP_MAX and ref.cdata not in _WEXP:
        _WEXP.pop(next(iter(_WEXP)))
    _WEXP[ref.cdata] = (ref, state, tab)
    return build() if tab is None else tab
