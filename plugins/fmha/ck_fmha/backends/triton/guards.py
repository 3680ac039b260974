"""Device-side guards of run-time page tables, as small Triton launches (issue #26).

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

Group-mode offsets (``cu_seqlens_q/k``) need no launch of their own: the kernels that read them check
them first (``kernels._group_offsets_bad``) and, where they are bad, write NaN over their outputs and set
``BAD_OFFSETS`` in the device flag (session 11; before, a guard launch clamped them here and a poisoning
launch filled the outputs: 3 launches per varlen forward, 9 per fwd+bwd, now 1 and 4).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ck_core.backends import triton_artifacts, triton_replay

from ...device_errors import BAD_PAGES, check_table, flag, guard_pages

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


def helper_entry(fn) -> str:
    """The kernel-cache entry name of a helper kernel that belongs to no key (``ck build`` and
    launches reach the same entry: a prebuilt set holds it, no JIT compile on a user's call)."""
    return "fmha/" + getattr(fn, "__name__", type(fn).__name__)
