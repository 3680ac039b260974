"""How a conv launch reaches its kernel, and the recording of a run's launches for warm calls.

:func:`_k` gives ``fn[grid]`` from the kernel cache under the running key's name (``_KERNEL``, set by
:func:`.launch.run`), or records the launch: ``ck build``'s representative calls, or the
:class:`Capture` of a run whose launches a warm call replays with new tensors (``make_launcher`` in
:mod:`.keys`).  :func:`_note` tells the running capture what a buffer is (:mod:`.buffers`).  Like
FMHA's ``backends/triton/warm.py``, for conv's single-run launches.
"""
from __future__ import annotations

import contextvars

from ...geometry import _cl_order, _perm
from ...problem import ConvProblem

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
        #: the kernels took the operands and wrote the result in the problem's layouts (no layout copies)
        self.direct = False

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
        elif out.data_ptr() != roles["y"].data_ptr() and (self.direct or not _is_layout_copy(out, roles["y"], p)):
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
        if self.direct:
            px = pw = po = None
        else:
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


#: per direction: the layout kinds of the two operands (IN_NAMES order) and of the result
_ROLE_KINDS = {"forward": (("in", "wei"), "out"), "bwd_data": (("out", "wei"), "in"),
               "bwd_weight": (("in", "out"), "wei")}


def _is_layout_copy(out, y, p: ConvProblem) -> bool:
    """Whether ``out`` is what :func:`from_channels_last` made of ``y`` (not a workspace's reduction)."""
    ky = _ROLE_KINDS[p.direction][1]
    lay = {"in": p.in_layout, "wei": p.wei_layout, "out": p.out_layout}[ky]
    return lay != _cl_order(ky, p.ndim) and out.numel() == y.numel() and out.dtype == y.dtype
