"""What an op tells the tile engine: the typed records of the ``ck_sweep_spec`` hook.

The core knows problems, keys and launchers but not which shapes matter for an
op, which columns describe them, or who the peer is; an op plugin answers
those with a :class:`SweepSpec`.  An op without one can still be swept with
``--shapes FILE`` and the generic columns.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import attrs

from ..errors import ConfigError


def _tuple(x) -> tuple:
    return tuple(x)


@attrs.frozen(eq=False)
class KernelSet:
    """How a seed-format kernel config maps onto an op's keys.

    ``arch``: the config's own arch (None: the command line's); ``options``:
    enumeration options (e.g. ``receipt``, ``families``); ``accept(key) -> bool``:
    the config's allow-lists over the enumerated keys.
    """

    arch: Optional[str] = None
    options: Mapping[str, Any] = attrs.field(factory=dict)
    accept: Optional[Callable] = None


@attrs.frozen(eq=False)
class SweepSpec:
    """One op's part of ``ck sweep``.

    * ``shapes``: path of the op's testing matrix (TOML, see :mod:`ck_core.sweep.matrix`);
    * ``problem_fields`` / ``kernel_fields``: the CSV columns after ``problem_name`` and
      after ``kernel`` (stable, in this order);
    * ``problem_columns(problem) -> dict`` and ``kernel_columns(key) -> dict`` fill them
      (a missing column is left empty);
    * ``make_problem(fields: dict) -> Problem`` (optional): a matrix row's fields to a
      problem (default ``problem_type.from_dict``);
    * ``kernel_config(data: dict, source: str) -> KernelSet`` (optional): a seed-format
      config (``variant``, ``trait_config``, ``arch``, ``receipt``); default: allow-lists
      over ``key.fields``;
    * ``filter_fields(key) -> dict`` (optional): what ``--filter`` expressions see as
      ``c.<field>`` (default ``key.fields``), e.g. the seed's spellings;
    * ``peer(problem, tensors) -> (name, fn) | None`` (optional): a zero-argument
      callable computing the same result with the peer library on the tensors the
      backend holds (None where there is no peer, e.g. numpy arrays on the CPU);
    * ``device_reference(problem, tensors) -> dict`` (optional): fp32 outputs computed
      on the device, used to check shapes too large for the float64 reference;
    * ``device_inputs(problem, tensors) -> dict`` (optional): the inputs as the backend
      moved them, cast once to what callers pass (numpy has no bf16, so bf16 arrives as
      float32); without it every timed call of a launcher would also time that cast;
    * ``bytes_moved(problem) -> float`` (optional, else ``OpSpec.bytes_moved``).
    """

    op: str
    shapes: Optional[str] = None
    problem_fields: tuple = attrs.field(converter=_tuple, default=())
    kernel_fields: tuple = attrs.field(converter=_tuple, default=())
    problem_columns: Optional[Callable] = None
    kernel_columns: Optional[Callable] = None
    make_problem: Optional[Callable] = None
    kernel_config: Optional[Callable] = None
    filter_fields: Optional[Callable] = None
    peer: Optional[Callable] = None
    device_reference: Optional[Callable] = None
    bytes_moved: Optional[Callable] = None
    device_inputs: Optional[Callable] = None


def cast_inputs(names, dtype: str, tensors: dict) -> dict:
    """Torch tensors among ``names`` cast from float32 to ``dtype`` (fp16/bf16); others unchanged.
    A helper for :attr:`SweepSpec.device_inputs`."""
    want = {"fp16": "float16", "bf16": "bfloat16"}.get(dtype)
    out = dict(tensors)
    for n in names:
        t = out.get(n)
        if want and t is not None and type(t).__module__.startswith("torch") and str(t.dtype) == "torch.float32":
            import torch

            out[n] = t.to(getattr(torch, want))
    return out


def get_spec(mgr, op_name: str) -> SweepSpec:
    """The op's SweepSpec from the ``ck_sweep_spec`` hook, or a generic one."""
    op = mgr.op(op_name)
    spec = mgr.hook.ck_sweep_spec(op=op)
    if spec is None:
        return SweepSpec(op=op_name)
    if not isinstance(spec, SweepSpec):
        raise ConfigError(f"the ck_sweep_spec hook for {op_name} returned {type(spec).__name__}; "
                          f"return a ck_core.sweep.SweepSpec")
    return spec


def generic_kernel_set(data: Mapping[str, Any], source: str, aliases: Optional[Mapping[str, str]] = None
                       ) -> KernelSet:
    """A seed-format config over ``key.fields``: ``variant`` matches a key's family (or
    direction) unless it names the op or ``all``; each ``trait_config`` entry is an
    allow-list of one field (a key without that field is not filtered by it)."""
    aliases = {"data_type": "dtype", **(aliases or {})}
    unknown = set(data) - {"variant", "trait_config", "arch", "receipt", "description", "name"}
    if unknown:
        raise ConfigError(f"{source}: unknown top-level key(s) {sorted(unknown)}; valid keys: "
                          f"variant, trait_config, arch, receipt, description, name")
    traits = []
    for raw, entry in (data.get("trait_config") or {}).items():
        values = entry.get("values") if isinstance(entry, dict) else entry
        if not isinstance(values, list):
            raise ConfigError(f"{source}: trait_config.{raw} must be a list or {{\"values\": [...]}}")
        traits.append((aliases.get(raw, raw), [tuple(v) if isinstance(v, list) else v for v in values]))
    variant = data.get("variant")

    def accept(key) -> bool:
        f = key.fields
        if variant not in (None, "all", key.op):
            if variant not in (f.get("family"), f.get("direction")):
                return False
        return all(f[name] in allowed for name, allowed in traits if name in f)

    return KernelSet(arch=data.get("arch"), accept=accept)
