"""KernelKey: Signature (what) + Algorithm (how) + arch + backend.

The key's ``name`` is its identity everywhere (registry, cache folder, CSV
rows, JSON).  It reads ``<body>.<arch>.<backend>`` where ``body`` comes from
the op plugin (``gemm_fp16_rcr_compv4_...``), and parses back to the same key.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional

import attrs

from .errors import MissingKernel, PluginError

_NAME_TAIL = re.compile(r"^(?P<body>.+)\.(?P<arch>[A-Za-z0-9_-]+)\.(?P<backend>[A-Za-z0-9_-]+)$")


def _to_plain(obj) -> dict:
    if attrs.has(type(obj)):
        return {k: (list(v) if isinstance(v, tuple) else v)
                for k, v in attrs.asdict(obj, recurse=False).items()}
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__}")


@attrs.frozen(cache_hash=True)
class KernelKey:
    op: str
    signature: Any
    algorithm: Any
    arch: str
    backend: str = "numpy"
    _flat: Any = attrs.field(default=None, init=False, eq=False, hash=False, repr=False)

    @property
    def body(self) -> str:
        fmt = getattr(self.signature, "name_body", None)
        if fmt is not None:  # signature classes may name themselves (no manager needed)
            return fmt(self.algorithm)
        from .plugins import get_manager

        return get_manager().op(self.op).format_name(self.signature, self.algorithm)

    @property
    def name(self) -> str:
        return f"{self.body}.{self.arch}.{self.backend}"

    @property
    def fields(self) -> dict:
        """All signature and algorithm fields in one flat dict (for filters); computed once."""
        if self._flat is None:
            out = {"op": self.op, "arch": self.arch, "backend": self.backend}
            out.update(_to_plain(self.signature))
            out.update(_to_plain(self.algorithm))
            object.__setattr__(self, "_flat", out)
        return self._flat

    def with_backend(self, backend: str) -> "KernelKey":
        return attrs.evolve(self, backend=backend)

    def with_arch(self, arch: str) -> "KernelKey":
        return attrs.evolve(self, arch=arch)

    def to_dict(self) -> dict:
        return {"name": self.name, "op": self.op, "arch": self.arch, "backend": self.backend,
                "signature": _to_plain(self.signature), "algorithm": _to_plain(self.algorithm)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], manager=None) -> "KernelKey":
        from .plugins import get_manager

        mgr = manager or get_manager()
        try:
            op = mgr.op(data["op"])
            sig, alg = op.from_fields(data["signature"], data["algorithm"])
            key = cls(op.name, sig, alg, data["arch"], data.get("backend", "numpy"))
        except KeyError as exc:
            raise MissingKernel(f"kernel record lacks the field {exc}; expected op, arch, "
                                f"backend, signature, algorithm") from None
        if "name" in data and data["name"] != key.name:
            raise MissingKernel(
                f"kernel record name {data['name']!r} disagrees with its fields ({key.name!r}); "
                f"the file was edited or written by another version"
            )
        return key

    @classmethod
    def from_name(cls, name: str, manager=None) -> "KernelKey":
        from .plugins import get_manager

        mgr = manager or get_manager()
        m = _NAME_TAIL.match(name)
        if not m:
            raise MissingKernel(
                f"kernel name {name!r} is not of the form <body>.<arch>.<backend>, "
                f"e.g. gemm_fp16_rcr_..._32x32x16.gfx942.numpy"
            )
        try:
            op = mgr.op_for_name(m["body"])
        except PluginError as exc:
            raise MissingKernel(str(exc)) from None
        sig, alg = op.parse_name(m["body"])
        return cls(op.name, sig, alg, m["arch"], m["backend"])

    def __str__(self) -> str:
        return self.name
