"""Device-side guards of run-time tables, as small Triton launches (issue #26).

Page tables.  :func:`ck_fmha.device_errors.guard_pages` checks a page table (``block_table`` [B,
max_pages], or the flat ``kv_page_indices`` that ``kv_indptr`` [B+1] splits per batch) against the page
pool.  On CPU tensors the host reads it; on a GPU that read would be a synchronisation per call, and the
torch form (:func:`ck_fmha.device_errors.guard_on_device`) is about ten small torch operations.
:class:`PageGuard` is the same check as one launch: program ``b`` reads the entries batch ``b`` uses
(its first ceil((seqlens_k[b] + appended) / page_size) pages; with ``kv_indptr``, of its own range, an
offset outside the table making the batch bad too) and writes the run-time length to launch with:
``seqlens_k[b]``, or -1 where a used entry lies outside the pool, which the decode / appendkv / prefill
kernels treat as a bad length (outputs NaN, nothing written, no page read); a bad batch ORs
``BAD_PAGES`` into the device flag.  The table itself is passed on unchanged: a batch marked -1 reads
none of its pages, and the others read only the entries checked here (the kernels read a page only for
keys below the batch's clamped length).  A PageGuard is built once per call signature (the cold path)
and called on every warm call: one ``torch.empty`` and the recorded launch
(:mod:`ck_core.backends.triton_replay`; ``fn[grid]`` where a replay cannot be set up).

Group-mode offsets.  :func:`guard_offsets` clamps ``cu_seqlens`` into the packed tensors and the
problem's ``max_seqlen`` in one launch (the torch form was about ten operations), ORs ``BAD_OFFSETS``
into the device flag when it changed anything and hands back a :class:`Bad` (the call's device flags);
:func:`poison` fills a launcher's outputs with NaN where one is set, one launch per tensor.  Both
launch through :func:`ck_fmha.backends.triton.warm.wrap`, so a recorded call replays them too
(:func:`ck_fmha.backends.triton.warm.scratch`: their int32 buffers are allocated again per replay).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ck_core.backends import triton_artifacts, triton_replay

from ...device_errors import BAD_OFFSETS, BAD_PAGES, check_table, flag, guard_pages
from . import warm

_BLOCK = 128


@triton.jit
def _page_guard_kernel(TABLE, stb, stc, width, LENS, OUT, INDPTR, numel, n_pages, page_size, appended, ERR,
                       BAD: tl.constexpr, FLAT: tl.constexpr, BLOCK: tl.constexpr):
    """OUT[b] = LENS[b], or -1 where an entry of the table that batch b uses lies outside [0, n_pages)
    (FLAT: or its offsets INDPTR[b], INDPTR[b+1] are outside [0, numel] or decrease); a bad batch ORs
    BAD into ERR."""
    b = tl.program_id(0)
    raw = tl.load(LENS + b)
    need = (tl.maximum(raw, 0).to(tl.int64) + appended + page_size - 1) // page_size
    offs = tl.arange(0, BLOCK)
    if FLAT:
        lo = tl.load(INDPTR + b)
        hi = tl.load(INDPTR + b + 1)
        bad = (lo < 0) | (hi > numel) | (hi < lo)
        count = tl.where(bad, 0, tl.minimum(hi - lo, need))
        base = TABLE + tl.maximum(lo, 0).to(tl.int64) * stc
    else:
        bad = need < 0   # (false: a scalar to OR into)
        count = tl.minimum(need, width)
        base = TABLE + b.to(tl.int64) * stb
    for j0 in range(0, count, BLOCK):
        j = j0 + offs
        m = j < count
        v = tl.load(base + j.to(tl.int64) * stc, mask=m, other=0)
        out_of_pool = m & ((v < 0) | (v >= n_pages))
        bad = bad | (tl.max(out_of_pool.to(tl.int32), axis=0) > 0)
    tl.store(OUT + b, tl.where(bad, -1, raw))
    if bad:
        tl.atomic_or(ERR, BAD)


class PageGuard:
    """``guard(table, seqlens_k, indptr=None) -> (table, seqlens_k)`` to launch with, for tables and
    lengths of one signature (shapes, strides, dtypes, device: the caller's warm-call key pins them):
    the host check of :func:`guard_pages` on CPU tensors, else the launch of :func:`_page_guard_kernel`.
    ``table`` and ``seqlens_k`` are int32; ``indptr`` (the SGLang form) any integer dtype."""

    __slots__ = ("num_pages", "page_size", "appended", "name", "flat", "record", "_replay", "_slots", "_batch",
                 "_device")

    def __init__(self, num_pages: int, page_size: int, *, name: str = "block_table", flat: bool = False,
                 appended: int = 0, record: bool = True):
        self.num_pages, self.page_size, self.appended = int(num_pages), int(page_size), int(appended)
        self.name, self.flat, self.record = name, flat, record
        self._replay = self._slots = self._batch = self._device = None

    def __call__(self, table, seqlens_k, indptr=None):
        r = self._replay
        if r is not None:
            out = torch.empty_strided((self._batch,), (1,), dtype=torch.int32, device=self._device)
            args = r.args.copy()
            ti, li, oi, ii = self._slots
            args[ti], args[li], args[oi], args[ii] = table, seqlens_k, out, indptr if self.flat else seqlens_k
            r(args)
            return table, out
        if table.device.type == "cpu" or table.numel() == 0:
            return guard_pages(table, self.num_pages, seqlens_k, self.page_size, name=self.name, indptr=indptr,
                               appended=self.appended)
        return table, self.on_device(table, seqlens_k, indptr)

    def on_device(self, table, seqlens_k, indptr=None):
        """The lengths to launch with, from the guard kernel on any device (the interpreter's on CPU
        tensors); the first launch on a GPU is recorded for the next calls where Triton allows."""
        check_table(table, self.name)
        b = seqlens_k.shape[0]
        out = torch.empty(b, dtype=torch.int32, device=seqlens_k.device)
        if b == 0:
            return out
        if self.flat:
            stb, stc, width = 0, table.stride(0), table.shape[0]
        else:
            stb, stc, width = table.stride(0), table.stride(1), table.shape[1]
        err = flag(table.device)
        args = (table, stb, stc, width, seqlens_k, out, indptr if self.flat else seqlens_k, table.numel(),
                self.num_pages, self.page_size, self.appended, err)
        kw = dict(BAD=BAD_PAGES, FLAT=self.flat, BLOCK=_BLOCK)
        if self.record and triton_replay.replayable(table) and not (
                table.is_cuda and torch.cuda.is_current_stream_capturing()):
            r = triton_replay.record(_page_guard_kernel, (b,), args, kw, name=helper_entry(_page_guard_kernel))
            if r is not None:
                self._replay, self._batch, self._device = r, b, seqlens_k.device
                self._slots = (r.slot("TABLE"), r.slot("LENS"), r.slot("OUT"), r.slot("INDPTR"))
                for i in self._slots:   # (no reference to this call's tensors)
                    r.args[i] = None
            return out
        triton_artifacts.launch(helper_entry(_page_guard_kernel), _page_guard_kernel, (b,), args, kw)
        return out


@triton.jit
def _clamp_offsets(CU, n, rows, longest, SAFE, BLOCK: tl.constexpr):
    """SAFE = offsets CU [n] clamped (see :func:`_offset_guard_kernel`); whether anything changed."""
    offs = tl.arange(0, BLOCK)
    c0 = tl.load(CU).to(tl.int64)
    start = tl.minimum(tl.maximum(c0, 0), rows)
    tl.store(SAFE, start.to(tl.int32))
    bad = c0 != start
    carry = start
    for j0 in range(1, n, BLOCK):
        j = j0 + offs
        m = j < n
        c = tl.load(CU + j, mask=m, other=0).to(tl.int64)
        prev = tl.load(CU + j - 1, mask=m, other=0).to(tl.int64)
        span = tl.where(m, tl.minimum(tl.maximum(c - prev, 0), longest), 0)
        safe = tl.minimum(tl.cumsum(span, 0) + carry, rows)
        tl.store(SAFE + j, safe.to(tl.int32), mask=m)
        bad = bad | (tl.max((m & (safe != c)).to(tl.int32), axis=0) > 0)
        carry = carry + tl.sum(span, axis=0)
    return bad


@triton.jit
def _offset_guard_kernel(CU, n, rows, longest, SAFE, BADOUT, ERR, CU2, rows2, longest2, SAFE2, BAD: tl.constexpr,
                         TWO: tl.constexpr, BLOCK: tl.constexpr):
    """SAFE = offsets CU [n] clamped: start in [0, rows], each span in [0, longest], each offset <= rows
    (TWO: also SAFE2 = CU2 [n] clamped by rows2, longest2: the key offsets in the same launch);
    BADOUT[0] = whether anything differs from the caller's (then BAD is ORed into ERR).  One program."""
    bad = _clamp_offsets(CU, n, rows, longest, SAFE, BLOCK)
    if TWO:
        bad = bad | _clamp_offsets(CU2, n, rows2, longest2, SAFE2, BLOCK)
    tl.store(BADOUT, bad.to(tl.int32))
    if bad:
        tl.atomic_or(ERR, BAD)


@triton.jit
def _fill_nan(X, n, BLOCK: tl.constexpr):
    pid, step = tl.program_id(0), tl.num_programs(0) * BLOCK
    offs = tl.arange(0, BLOCK)
    nan = tl.full([BLOCK], float("nan"), X.dtype.element_ty)
    for i0 in range(pid * BLOCK, n, step):
        i = offs.to(tl.int64) + i0
        tl.store(X + i, nan, mask=i < n)


@triton.jit
def _poison_kernel(X, n, F1, F2, X1, n1, X2, n2, X3, n3, TWO: tl.constexpr, COUNT: tl.constexpr,
                   BLOCK: tl.constexpr):
    """X[:n] (and X1[:n1] .. : COUNT tensors, each dense) = NaN where F1[0] (or F2[0]) is set; grid-stride
    loops that end at once otherwise.  One launch for all of a launcher's outputs."""
    bad = tl.load(F1)
    if TWO:
        bad = bad | tl.load(F2)
    if bad != 0:
        _fill_nan(X, n, BLOCK)
        if COUNT > 1:
            _fill_nan(X1, n1, BLOCK)
        if COUNT > 2:
            _fill_nan(X2, n2, BLOCK)
        if COUNT > 3:
            _fill_nan(X3, n3, BLOCK)


class Bad:
    """The device flags (int32 [1] each: nonzero = the guard changed something) of one call's guards;
    ``a | b`` joins two calls' flags without a device operation."""

    __slots__ = ("flags",)

    def __init__(self, flags):
        self.flags = tuple(flags)

    def __or__(self, other):
        return self if other is None else Bad(self.flags + other.flags)


_POISON_BLOCK, _POISON_PROGRAMS = 1024, 1024   # (a bound on the grid: its programs stride over the tensor)


def helper_entry(fn) -> str:
    """The kernel-cache entry name of a helper kernel that belongs to no key (``ck build`` and
    launches reach the same entry: a prebuilt set holds it, no JIT compile on a user's call)."""
    return "fmha/" + getattr(fn, "__name__", type(fn).__name__)


def _launch(fn, grid, *args, **kw):
    launch = triton_artifacts.bind(helper_entry(fn), fn, grid)
    return warm.wrap(fn, grid, launch)(*args, **kw)   # (recorded inside warm.recording())


def guard_offsets(cu: torch.Tensor, rows: int, longest: int):
    """(offsets safe to launch with: int32 [batch+1], :class:`Bad`) for group-mode offsets ``cu``
    [batch+1] into a packed tensor of ``rows`` rows whose sequences are at most ``longest`` long: the
    start clamped into [0, rows], each span into [0, longest], each offset to at most ``rows``.  One
    launch, no host synchronisation; a difference sets ``BAD_OFFSETS`` in the flag of ``cu``'s device."""
    n = cu.numel()
    safe = torch.empty(n, dtype=torch.int32, device=cu.device)
    bad = torch.empty(1, dtype=torch.int32, device=cu.device)
    warm.scratch(safe)
    warm.scratch(bad)
    _launch(_offset_guard_kernel, (1,), cu, n, int(rows), max(0, int(longest)), safe, bad, flag(cu.device),
            cu, 0, 0, safe, BAD=BAD_OFFSETS, TWO=False, BLOCK=128)
    return safe, Bad((bad,))


def guard_offsets_pair(cu_q: torch.Tensor, rows_q: int, longest_q: int, cu_k: torch.Tensor, rows_k: int,
                       longest_k: int):
    """(safe query offsets, safe key offsets, :class:`Bad`): :func:`guard_offsets` of both in one launch
    (``cu_q`` and ``cu_k`` on one device, with the same number of offsets)."""
    n = cu_q.numel()
    if cu_k.numel() != n or cu_k.device != cu_q.device:
        safe_q, bad_q = guard_offsets(cu_q, rows_q, longest_q)
        safe_k, bad_k = guard_offsets(cu_k, rows_k, longest_k)
        return safe_q, safe_k, bad_q | bad_k
    safe_q = torch.empty(n, dtype=torch.int32, device=cu_q.device)
    safe_k = torch.empty(n, dtype=torch.int32, device=cu_q.device)
    bad = torch.empty(1, dtype=torch.int32, device=cu_q.device)
    for t in (safe_q, safe_k, bad):
        warm.scratch(t)
    _launch(_offset_guard_kernel, (1,), cu_q, n, int(rows_q), max(0, int(longest_q)), safe_q, bad,
            flag(cu_q.device), cu_k, int(rows_k), max(0, int(longest_k)), safe_k, BAD=BAD_OFFSETS, TWO=True,
            BLOCK=128)
    return safe_q, safe_k, Bad((bad,))


def poison(bad, *ts) -> None:
    """Fill the floating-point tensors ``ts`` with NaN where ``bad`` (a :class:`Bad`, or a device bool
    tensor) says a guard changed the call's offsets; no host synchronisation."""
    if bad is None:
        return
    dense = []
    for t in ts:
        if t is None or not t.is_floating_point():
            continue
        if not isinstance(bad, Bad):
            t.masked_fill_(bad, float("nan"))
            continue
        flags = bad.flags
        if not t.is_contiguous() or len(flags) > 2:
            any_bad = flags[0].bool() if len(flags) == 1 else torch.stack(flags).any()
            t.masked_fill_(any_bad.reshape(()), float("nan"))
            continue
        if t.numel():
            dense.append(t)
    for i in range(0, len(dense), 4):   # one launch for up to four tensors
        part = dense[i:i + 4]
        grid = (min(triton.cdiv(max(t.numel() for t in part), _POISON_BLOCK), _POISON_PROGRAMS),)
        more = []
        for j in range(1, 4):
            t = part[j] if j < len(part) else part[0]
            more += [t, t.numel() if j < len(part) else 0]
        flags = bad.flags
        _launch(_poison_kernel, grid, part[0], part[0].numel(), flags[0], flags[-1], *more, TWO=len(flags) == 2,
                COUNT=len(part), BLOCK=_POISON_BLOCK)
