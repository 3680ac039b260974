"""Typed records that plugins hand to the core through the hooks.

Hooks return these, never bare dicts (the shape is checked once, here, so a
broken plugin fails at load time with its own name in the message).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import attrs

from .errors import PluginError


def _tuple(x: Iterable) -> tuple:
    return tuple(x)


@attrs.frozen(eq=False)
class ArchSpec:
    """One GPU architecture: hardware facts, kernel-space tables and rules.

    ``warp_tiles`` maps a dtype token (``"fp16"``, ``"fp8"`` ...) to the legal
    (M, N, K) matrix-instruction tiles of one warp; ``wave_layouts`` lists the
    legal warps-per-block arrangements; ``pipeline_lds_limit`` gives, per GEMM
    pipeline, the LDS/shared-memory bytes a kernel may use.  ``rules`` are
    callables ``rule(key) -> str | None`` returning why a kernel key is illegal
    on this arch (or ``None``).  ``extras`` holds op-specific facts, keyed by op
    name (e.g. ``extras["fmha"]``).  ``triton_target`` is the
    ``(backend, arch, warp_size)`` triple of ``triton.backends.compiler.GPUTarget``.
    """

    name: str
    vendor: str = attrs.field(validator=attrs.validators.in_(("amd", "nvidia", "other")))
    family: str
    warp_size: int
    lds_bytes: int
    compute_units: int
    dtypes: tuple = attrs.field(converter=_tuple)
    warp_tiles: Mapping[str, tuple] = attrs.field(factory=dict)
    wave_layouts: tuple = attrs.field(converter=_tuple, default=((2, 2, 1),))
    pipelines: tuple = attrs.field(converter=_tuple, default=())
    pipeline_lds_limit: Mapping[str, int] = attrs.field(factory=dict)
    triton_target: Optional[tuple] = None
    description: str = ""
    peak: Mapping[str, float] = attrs.field(factory=dict)
    extras: Mapping[str, Any] = attrs.field(factory=dict)
    rules: tuple = attrs.field(converter=_tuple, default=())
    distribution: str = ""

    def gpu_target(self):
        """The ``triton`` GPUTarget of this arch (imports triton lazily)."""
        if self.triton_target is None:
            raise PluginError(f"arch {self.name} declares no triton_target; its plugin must set one")
        from triton.backends.compiler import GPUTarget

        return GPUTarget(*self.triton_target)

    def reject(self, key) -> Optional[str]:
        """Why ``key`` is illegal on this arch, or None when it is legal."""
        for rule in self.rules_for(key.op):
            reason = rule(key)
            if reason:
                return reason
        return None

    def rules_for(self, op: str) -> tuple:
        """The rules that may reject keys of ``op``: a rule with an ``ops`` attribute (a tuple
        of op names) reads only those ops' keys, so an op without rules skips the check."""
        return tuple(r for r in self.rules if op in getattr(r, "ops", (op,)))

    def summary(self) -> dict:
        return {
            "name": self.name, "vendor": self.vendor, "family": self.family,
            "warp_size": self.warp_size, "lds_bytes": self.lds_bytes,
            "compute_units": self.compute_units, "dtypes": list(self.dtypes),
            "pipelines": list(self.pipelines),
            "triton_target": list(self.triton_target) if self.triton_target else None,
            "distribution": self.distribution,
        }


@attrs.frozen(eq=False)
class OpSpec:
    """One operation (gemm, conv, fmha): problem type, kernel space, references.

    Callables (all receive plain values; none may touch global state):

    * ``enumerate(arch: ArchSpec, backend: str, options: dict) -> iterable of KernelKey``
    * ``format_name(signature, algorithm) -> str`` and ``parse_name(body) -> (signature, algorithm)``
      -- the name body always starts with ``f"{name}_"`` and never repeats the key's arch or
      backend (the name's tail ``.<arch>.<backend>``); a ``parse_name`` that takes the keywords
      ``arch`` and ``backend`` receives them (an op whose key spaces differ per arch/backend);
    * ``from_fields(signature: dict, algorithm: dict) -> (signature, algorithm)`` for JSON;
    * ``supports(key, problem) -> str | None``: None when the kernel computes the problem,
      else the reason it cannot;
    * ``supports_many(keys: tuple, problem) -> sequence of bool`` (optional): for every key
      at once, whether ``supports(key, problem)`` is None (the Registry's candidate filter of
      a new problem; the same tuple object comes back for one registry, so per-key columns can
      be cached by identity); it must agree with ``supports`` key for key;
    * ``plan(problem) -> list[(stage_name, sub_problem)]``: one entry for single-stage ops;
    * ``reference(problem, tensors: dict) -> dict`` in float64;
    * ``make_inputs(problem, rng) -> dict`` of fresh random numpy inputs;
    * ``implement(key, backend: str, arch: ArchSpec) -> callable(problem, tensors) -> dict``:
      ``arch`` is the Dispatcher's arch, whose facts (compute units, shared memory) a
      launcher reads instead of constants;
    * ``flops(problem) -> float`` and ``bytes_moved(problem) -> float`` (the bytes of the
      problem's tensors: the Dispatcher refuses a problem they cannot fit before allocating);
    * ``working_bytes(problem, backend: str) -> float`` (optional): memory the op's
      implementation on ``backend`` needs beyond the tensors (the numpy backend's float64
      copies and intermediates), checked with them;
    * ``heuristic(problem, candidates, arch) -> list`` (optional first-pick ranking);
    * ``features(problem, candidates, arch) -> {name: array}`` (optional): one value per
      candidate and feature, what a learned ranker (:mod:`ck_core.ranker`) reads;
    * ``render(key, backend) -> rendered`` (optional): an object with ``compile(target)``
      and ``source_hash`` that compiling backends (triton, ck) build ahead of time;
    * ``bench(peer, options) -> {"rows": [...], "extra": {...}}`` (optional): ``ck bench``;
    * ``legal(key, arch: ArchSpec) -> str | None`` (optional): why the op's enumeration
      rules would reject ``key`` on ``arch`` (keys imported from JSON are checked with it);
    * ``key_space(arch: ArchSpec, backend: str, options: dict) -> KeySpace`` (optional): the
      enumeration as a :class:`ck_core.keyspace.KeySpace` that the Registry keeps unexpanded
      (for spaces too large to list per call); ``enumerate`` must list the same keys;
    * ``shortlist(problem, arch: ArchSpec, backend: str) -> iterable of tiers`` (optional), a
      tier being an iterable of KernelKeys: the keys the op's heuristic considers first for
      ``problem``, best tier first; the Dispatcher ranks the keys of the first tier that the
      registry holds and that support the problem, and ranks every candidate only when no
      tier has one (a new problem then costs a few ``supports()`` calls, not one per key);
    * ``selection_family(problem, arch: ArchSpec, backend: str) -> hashable | None`` (optional):
      what of ``problem`` the op's selection on (arch, backend) reads, with the sizes that leave its
      pick unchanged removed or bucketed (e.g. :func:`ck_core.dispatcher.size_bucket`); the
      Dispatcher reuses the pick of a family's first problem for a later one of the same family where
      that key still ``supports()`` it (a new size of a known signature then costs one ``supports()``
      call, not a selection).  None: no family (the problem is selected in full).  Where the ranking
      reads sizes continuously (a learned ranker's features), the buckets are the op's stated
      approximation, checked against full selections by its tests;
    * ``problem_options(problem) -> dict`` (optional): enumeration options whose registry still
      holds every key that supports ``problem`` and each stage of its plan (dtype, layout,
      family ...); ``ck run``, ``ck tune`` and ``ck demo`` enumerate only that part of the
      space, as the public API does (options the user gives win, option by option).

    ``options`` maps each enumeration option ``enumerate`` accepts to a one-line
    help (``ck list <op> --help`` prints them; unknown flags are checked against them).
    ``api_options`` are the enumeration options of the registry the op's public
    (torch) API dispatches through (see :func:`ck_core.api.dispatcher_for`).
    """

    name: str
    problem_type: type
    enumerate: Callable
    format_name: Callable
    parse_name: Callable
    from_fields: Callable
    supports: Callable
    reference: Callable
    make_inputs: Callable
    implement: Callable
    input_names: tuple = attrs.field(converter=_tuple)
    output_names: tuple = attrs.field(converter=_tuple)
    plan: Optional[Callable] = None
    render: Optional[Callable] = None
    bench: Optional[Callable] = None
    flops: Optional[Callable] = None
    bytes_moved: Optional[Callable] = None
    working_bytes: Optional[Callable] = None
    heuristic: Optional[Callable] = None
    features: Optional[Callable] = None
    supports_many: Optional[Callable] = None
    families: tuple = attrs.field(converter=_tuple, default=())
    options: Mapping[str, str] = attrs.field(factory=dict)
    api_options: Mapping[str, Any] = attrs.field(factory=dict)
    tolerance: Optional[Callable] = None
    legal: Optional[Callable] = None
    key_space: Optional[Callable] = None
    shortlist: Optional[Callable] = None
    problem_options: Optional[Callable] = None
    selection_family: Optional[Callable] = None
    description: str = ""
    distribution: str = ""
    #: folder of the op's shipped tuned-data files (``<arch>.json``, read by ck_core.tuned_data)
    tuning_data: Optional[str] = None


@attrs.frozen(eq=False)
class BackendSpec:
    """A way to execute kernels.

    * ``available() -> (bool, reason)``: can this backend compile here at all;
    * ``can_execute(arch: ArchSpec) -> (bool, reason)``: can it *run* kernels for ``arch``
      on this machine (the numpy backend runs anything; triton needs that GPU);
    * ``compile(key, op: OpSpec, arch: ArchSpec, cache_dir) -> dict`` of build metadata
      (may raise CompileError); ``None`` when there is nothing to build;
    * ``to_backend(array)`` / ``to_numpy(tensor)`` move data in and out.
    """

    name: str
    available: Callable
    can_execute: Callable
    to_backend: Callable
    to_numpy: Callable
    compile: Optional[Callable] = None
    synchronize: Optional[Callable] = None
    timer: Optional[Callable] = None
    description: str = ""
    distribution: str = ""


@attrs.frozen
class DemoCase:
    """One case of ``ck demo``: a problem of ``op``, dispatched on a registry
    enumerated with ``options``.  Cases run in ascending ``order``."""

    op: str
    problem: Any
    options: Mapping[str, Any] = attrs.field(factory=dict)
    order: int = 0


@attrs.frozen
class Stage:
    """One launch of a plan: a stage name, the sub-problem and the chosen key."""

    name: str
    problem: Any
    key: Any


@attrs.frozen
class Plan:
    problem: Any
    stages: tuple = attrs.field(converter=_tuple)

    def describe(self) -> list[dict]:
        return [{"stage": s.name, "kernel": s.key.name} for s in self.stages]


def check_records(records: Sequence, kind: type, plugin: str) -> list:
    out = []
    for rec in records or ():
        if not isinstance(rec, kind):
            raise PluginError(
                f"plugin {plugin!r} returned {type(rec).__name__} where {kind.__name__} "
                f"records are expected; build them with ck_core.{kind.__name__}(...)"
            )
        out.append(rec)
    return out
