"""Errors found on the device: run-time key lengths outside the key capacity, bad group-mode offsets.

The decode, appendkv and batch_prefill kernels read ``seqlens_k`` on the device, where the host
cannot check it without a synchronisation on the hot path.  So the kernels check it themselves:
a length < 0 or past the capacity (the cache length or ``max_seqlen_k``, bounded by the block
table; appendkv: the capacity less the appended tokens) is clamped into range so that no access
leaves the cache or the block table, the batch's outputs become NaN (decode/prefill: ``o`` and
``lse`` rows; appendkv: the rotated q rows, and nothing is written to the caches), and the kernel
ORs a code into a per-device int32 flag (:func:`flag`).

Group mode's offsets (``cu_seqlens_q``/``cu_seqlens_k``) stay on the device too: every Triton
kernel that reads them checks them first (``ck_fmha.backends.triton.kernels._group_offsets_bad``:
the start below 0, a span below 0 or past the caller's ``max_seqlen``, an offset past the packed
tensor's rows).  Bad ones -- any batch's -- make the kernel read nothing, write NaN over the whole
of its outputs (rows of no sequence too) and OR ``BAD_OFFSETS`` into the flag, in the same launch.
:func:`guard_offsets` here is that contract in torch operations (offsets clamped into range, and
whether anything had to change): the reference the kernels' check is tested against.

The flag is read without a host synchronisation where reading is free (tensors on the CPU, e.g.
the Triton interpreter): the next decode/appendkv/prefill call raises.  On a GPU it is read when
the caller asks, :func:`check_errors` (one synchronisation, e.g. once per scheduler step); the
NaN outputs make the bad batch visible meanwhile.  Reading the flag resets it.
"""
from __future__ import annotations

import torch

from ck_core.errors import InvalidProblem
from ck_core.memory import persistent

#: codes the kernels OR into the flag
TOO_LONG = 1     # a length past the capacity
NEGATIVE = 2     # a negative length
BAD_OFFSETS = 4  # group-mode offsets below 0, decreasing, past the packed rows, or longer than max_seqlen
BAD_PAGES = 8    # a page index (block_table / kv_page_indices) outside the page pool

_FLAGS: dict = {}   # torch.device -> int32 [1]


class DeviceLengthError(InvalidProblem):
    """A kernel found a run-time ``seqlens_k`` entry outside [0, capacity], or group-mode offsets
    that do not fit the packed tensors and ``max_seqlen_q/k``."""


def flag(device) -> torch.Tensor:
    """The int32 [1] error flag of ``device`` (zero until a kernel finds a bad length)."""
    device = torch.device(device)
    t = _FLAGS.get(device)
    if t is None:
        # for good, outside any CUDA graph's pool (a first call may run in a graph's warm-up)
        t = _FLAGS[device] = persistent(lambda: torch.zeros(1, dtype=torch.int32, device=device), device)
    return t


def _message(code: int, where: str) -> str:
    if code & BAD_PAGES:
        msg = (f"a page table (block_table / kv_page_indices) in an earlier FMHA call on {where} indexed a page "
               "outside the page pool: those batches' outputs were set to NaN, nothing was written and no page "
               "outside the pool was read; keep every used entry in [0, num_pages)")
        rest = code & ~BAD_PAGES & ~NEGATIVE   # the -1 lengths of those batches flag NEGATIVE too
        return msg if not rest else msg + "; also " + _message(rest, where)
    if code & BAD_OFFSETS:
        msg = (f"group-mode offsets (cu_seqlens_q/cu_seqlens_k) in an earlier FMHA call on {where} started "
               "below 0, decreased, ran past the packed q/k rows, or had a sequence longer than max_seqlen_q/"
               "max_seqlen_k: that call's outputs were set to NaN and nothing outside the tensors was read or "
               "written; pass cu_seqlens = [0, *cumsum(lengths)] and max_seqlen = max(lengths)")
        return msg if code == BAD_OFFSETS else msg + "; also " + _message(code & ~BAD_OFFSETS, where)
    what = []
    if code & TOO_LONG:
        what.append("past the key capacity (the cache length or max_seqlen_k, bounded by the block table's "
                    "pages; for appendkv less the tokens appended)")
    if code & NEGATIVE:
        what.append("negative")
    return (f"a run-time seqlens_k entry was {' and '.join(what)} in an earlier FMHA call on {where}: those "
            "batches' outputs were set to NaN and nothing outside the cache was read or written; fix "
            "seqlens_k (each entry in [0, capacity])")


def guard_offsets(cu: torch.Tensor, rows: int, longest: int):
    """(offsets clamped into range, device bool: they differ from ``cu``) for group-mode offsets
    ``cu`` [batch+1] into a packed tensor of ``rows`` rows whose sequences are at most ``longest``
    long.  Device ops only (no host synchronisation); a difference sets ``BAD_OFFSETS`` in the flag
    of ``cu``'s device.  The launchers do not call it (the kernels check the offsets themselves, see
    above); it is the torch statement of what "bad" means."""
    c = cu.to(torch.int64)
    spans = (c[1:] - c[:-1]).clamp_(0, max(0, int(longest)))
    start = c[:1].clamp(0, rows)
    safe = torch.cat((start, start + spans.cumsum(0))).clamp_(max=rows)
    bad = (safe != c).any()
    f = flag(cu.device)
    f.bitwise_or_(bad.to(torch.int32) * BAD_OFFSETS)
    return safe.to(torch.int32), bad


def _take(device, t: torch.Tensor) -> None:
    code = int(t.item())
    if code:
        t.zero_()
        raise DeviceLengthError(_message(code, str(device)))


def raise_pending() -> None:
    """The lazy check at the start of a call: raise for flags that can be read without a sync."""
    for device, t in _FLAGS.items():
        if device.type == "cpu":
            _take(device, t)


def check_errors() -> None:
    """Read every device's flag (a host synchronisation) and raise :class:`DeviceLengthError` if a
    kernel found a bad ``seqlens_k`` since the last check; the flags are reset."""
    for device, t in _FLAGS.items():
        if device.type != "meta":   # (shape-only runs launch nothing)
            _take(device, t)



def guard_pages(table, num_pages: int, seqlens_k: torch.Tensor, page_size: int, name: str = "block_table",
                indptr=None, appended: int = 0):
    """(page table, seqlens_k) to launch with, for a page table (``block_table`` [B, max_pages], or
    the flat ``kv_page_indices`` that ``indptr`` [B+1] splits per batch) into a pool of ``num_pages``.

    Only the entries a batch uses are checked: those of its first ceil((seqlens_k + ``appended``) /
    ``page_size``) pages (a block table may be padded with anything past them); with ``indptr``,
    ``table[indptr[b]:indptr[b+1]]``.  On CPU tensors the host reads them (free) and refuses an index
    outside the pool.  On a GPU that read would be a synchronisation per call, so device ops only:
    the batches with a bad page get run-time length -1, which the kernels treat as a bad length (their
    outputs NaN, nothing written, no page read), the table is clamped into the pool, and ``BAD_PAGES``
    is ORed into the device's flag (:func:`check_errors`).  The public calls use the one-launch form of
    this device check instead (:class:`ck_fmha.backends.triton.guards.PageGuard`, built once per call
    signature): it marks the same batches -1 and passes the table on unclamped."""
    check_table(table, name)
    if table.numel() == 0:
        return table, seqlens_k
    if table.device.type == "cpu":
        used = _used_entries(table, seqlens_k, page_size, indptr, appended)
        vals = table[used] if used is not None else table
        if vals.numel():
            lo, hi = int(vals.min()), int(vals.max())
            if lo < 0 or hi >= num_pages:
                raise InvalidProblem(f"{name} indexes pages {lo}..{hi}, outside the pool of {num_pages} pages "
                                     f"(0..{num_pages - 1})")
        return table, seqlens_k
    return guard_on_device(table, num_pages, seqlens_k, page_size, indptr, appended)


def check_table(table, name: str = "block_table") -> None:
    """Refuse a page table that is not an integer tensor."""
    if not isinstance(table, torch.Tensor):
        raise InvalidProblem(f"{name} must be an int32 torch tensor, got {type(table).__name__}")
    if table.dtype.is_floating_point or table.dtype == torch.bool or table.is_complex():
        raise InvalidProblem(f"{name} must hold integer page indices (int32), got {table.dtype}")


def guard_on_device(table, num_pages: int, seqlens_k, page_size: int, indptr=None, appended: int = 0):
    """:func:`guard_pages`' device form (torch ops only, no host read; any device)."""
    out_of_pool = (table < 0) | (table >= num_pages)
    b = seqlens_k.shape[0]
    if indptr is None:
        need = (seqlens_k.to(torch.int64) + appended + page_size - 1).div(page_size, rounding_mode="floor")
        cols = torch.arange(table.shape[1], device=table.device)
        bad = (out_of_pool & (cols[None, :] < need[:, None])).any(dim=1)
    else:
        owner = torch.searchsorted(indptr[1:].to(torch.int64).contiguous(),
                                   torch.arange(table.numel(), device=table.device), right=True).clamp_(max=b)
        bad = torch.zeros(b + 1, dtype=torch.int32, device=table.device).index_add_(
            0, owner, out_of_pool.reshape(-1).to(torch.int32))[:b] > 0
    flag(table.device).bitwise_or_(bad.any().to(torch.int32) * BAD_PAGES)
    seqlens_k = torch.where(bad, torch.full_like(seqlens_k, -1), seqlens_k)
    return table.clamp(0, max(num_pages - 1, 0)).to(table.dtype), seqlens_k


def _used_entries(table, seqlens_k, page_size: int, indptr, appended: int):
    """Host mask of the entries the batches use (None: all, where the lengths are not on the host)."""
    if indptr is not None:
        if indptr.device.type != "cpu":
            return None
        mask = torch.zeros(table.numel(), dtype=torch.bool)
        mask[:max(0, min(int(indptr[-1]), table.numel()))] = True
        return mask.view(table.shape)
    if seqlens_k.device.type != "cpu" or table.dim() != 2:
        return None
    need = (seqlens_k.to(torch.int64).clamp(min=0) + appended + page_size - 1) // page_size
    return torch.arange(table.shape[1])[None, :] < need[:, None]
