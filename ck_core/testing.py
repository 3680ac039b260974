"""A test kit for plugin authors: a fake arch, fresh random generators, a reference check.

Use from a plugin's ``conftest.py``::

    pytest_plugins = ["ck_core.testing"]

Every test session gets a private, temporary ``CK_CACHE_DIR``, ``CK_TUNING_DB`` (so the
tuned-data store is ``<tmp>/tuning.d``; ``CK_TUNED_DIR`` is unset) and ``XDG_CACHE_HOME`` (set before collection, removed at the end), so no test reads
or writes the user's real cache, even one that unsets ``CK_CACHE_DIR``.

Fixtures: ``ck_rng`` (a fresh generator; its seed is printed on failure),
``fake_arch`` (an ArchSpec any op can enumerate on), ``ck_manager`` (a plugin
manager with the fake arch added), ``ck_dispatch_log`` (like ``ck_manager``,
plus a :class:`DispatchLog` of every Dispatcher run, with CPU tensors of the
public APIs dispatching on the fake arch), and the helpers
:func:`check_against_reference` (op plugins) and :func:`check_arch_plugin`
(arch plugins), :func:`check_op_plugin` (op plugins; docs/writing-an-op-plugin.md); for warm-path
tests on the CPU, :class:`InterpReplay`, :func:`interp_record` and :func:`interp_replays` (recorded
launches replayed by Triton's interpreter); :func:`skip_unless_backend`; :func:`run_compiled` (a
script that compiles real kernels, in a process of its own, its ``RESULT`` JSON back).
"""
from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import types

import numpy as np
import pytest

from .hookspecs import hookimpl
from .records import ArchSpec


def make_fake_arch(name: str = "fake64", warp_size: int = 64, lds_bytes: int = 65536) -> ArchSpec:
    return ArchSpec(
        name=name, vendor="other", family="test", warp_size=warp_size, lds_bytes=lds_bytes,
        compute_units=8, dtypes=("fp16", "bf16", "fp32", "fp8", "bf8", "int8"),
        warp_tiles={d: ((32, 32, 8), (16, 16, 16)) for d in ("fp16", "bf16", "fp32", "int8", "fp8", "bf8")},
        wave_layouts=((2, 2, 1), (1, 4, 1)), pipelines=("mem", "compv3", "compv4"),
        pipeline_lds_limit={"mem": lds_bytes, "compv3": lds_bytes, "compv4": lds_bytes},
        extras={"gemm": {"tiles_mn": (64, 128), "tile_k_bytes": (64,)}},
        description="a fake arch for tests",
    )


def arch_plugin(*archs: ArchSpec):
    """A plugin object registering ``archs`` (pass it to ``PluginManager(plugins=[...])``)."""
    mod = types.ModuleType(f"ck_test_arch_{'_'.join(a.name for a in archs)}")

    @hookimpl
    def ck_register_archs():
        return list(archs)

    mod.ck_register_archs = ck_register_archs
    return mod


_SESSION_ENV = ("CK_CACHE_DIR", "CK_TUNING_DB", "CK_TUNED_DIR", "XDG_CACHE_HOME", "TRITON_CACHE_DIR")


def pytest_configure(config):
    if getattr(config, "_ck_test_env", None) is not None:
        return
    tmp = tempfile.mkdtemp(prefix="ck-test-")
    config._ck_test_env = (tmp, {k: os.environ.get(k) for k in _SESSION_ENV})
    os.environ["CK_CACHE_DIR"] = os.path.join(tmp, "ck-cache")
    os.environ["CK_TUNING_DB"] = os.path.join(tmp, "tuning.json")
    os.environ.pop("CK_TUNED_DIR", None)   # it would win over CK_TUNING_DB, which tests repoint
    os.environ["XDG_CACHE_HOME"] = os.path.join(tmp, "xdg-cache")
    # Triton's own compile cache (~/.triton by default) is a user cache too
    os.environ["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton-cache")


def pytest_unconfigure(config):
    state = getattr(config, "_ck_test_env", None)
    if state is None:
        return
    tmp, saved = state
    config._ck_test_env = None
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def ck_rng(request):
    seed = int(os.environ.get("CK_TEST_SEED") or secrets.randbits(32))
    request.node.user_properties.append(("seed", seed))
    sys.stderr.write(f"[ck] {request.node.name}: seed {seed} (set CK_TEST_SEED to replay)\n")
    return np.random.default_rng(seed)


@pytest.fixture
def fake_arch():
    return make_fake_arch()


@pytest.fixture
def ck_manager(fake_arch, monkeypatch):
    from . import plugins

    mgr = plugins.PluginManager(plugins=[arch_plugin(fake_arch)])
    monkeypatch.setattr(plugins, "_MANAGER", mgr)
    return mgr


class DispatchLog:
    """A plugin recording each Dispatcher run: ``(problem, plan's kernel names, launched names)``."""

    def __init__(self):
        self.runs: list = []
        self.manager = None

    @hookimpl
    def ck_after_run(self, problem, plan, launched):
        self.runs.append((problem, tuple(s.key.name for s in plan.stages), tuple(launched)))

    def take(self) -> list:
        """The runs recorded since the last take."""
        runs, self.runs = self.runs, []
        return runs


@pytest.fixture
def ck_dispatch_log(fake_arch, monkeypatch):
    from . import plugins

    log = DispatchLog()
    log.manager = plugins.PluginManager(plugins=[arch_plugin(fake_arch), log])
    monkeypatch.setattr(plugins, "_MANAGER", log.manager)
    monkeypatch.setenv("CK_CPU_ARCH", fake_arch.name)
    return log


def check_against_reference(dispatcher, problem, rng, poison: bool = True):
    """Run ``problem`` through ``dispatcher`` on fresh inputs; return the validation report."""
    from .validate import compare_all

    mgr = dispatcher.mgr
    op = mgr.op(problem.op)
    inputs = op.make_inputs(problem, rng)
    ref = op.reference(problem, inputs)
    backend = dispatcher.backend_spec
    moved = {k: backend.to_backend(v) for k, v in inputs.items()}
    outs = dispatcher.run_dict(problem, moved)
    missing = [k for k in ref if outs.get(k) is None]
    if missing:
        from .errors import ValidationFailed

        raise ValidationFailed(f"{problem.op}: the plan produced no {', '.join(map(repr, missing))}, which the "
                               f"reference computes for this problem (produced: {', '.join(sorted(outs))})")
    got = {k: backend.to_numpy(outs[k]) for k in ref}
    tol = op.tolerance(problem) if op.tolerance else {}
    dtypes = {k: getattr(problem, "dtype_c", getattr(problem, "dtype", "fp32")) for k in ref}
    return compare_all(got, ref, dtypes, tol)


def check_arch_plugin(spec: ArchSpec, *, plugin, name: str, vendor: str, target: tuple,
                      warp_size: int, lds_bytes: int, pipelines=None,
                      distribution: str | None = None, ops=None) -> dict:
    """Assert what every arch plugin must satisfy; return each checked op's keys.

    ``spec`` is the plugin's record, ``plugin`` the module holding its
    ``ck_register_archs`` hook; the keywords are the facts the record must
    state (``pipelines``: the exact set, when given; ``distribution``: the pip
    name, ``ck-arch-<name>`` by default).  Checks the record's shape and
    consistency, its Triton target, its entry point (when pip-installed), and
    the kernel space each installed op plugin (``ops``: those op names, default
    all installed) enumerates on it: non-empty, dtypes among the arch's, every
    key legal, names unique and round-tripping.

    Every check that can run runs; what cannot (no triton, an op plugin not
    installed, plugin not pip-installed) is named in one ``pytest.skip`` at the end.
    """
    from importlib import metadata

    from .key import KernelKey
    from .plugins import PluginManager
    from .registry import enumerate_keys

    unchecked = []
    # -- the record
    assert isinstance(spec, ArchSpec), type(spec)
    assert (spec.name, spec.vendor, spec.warp_size, spec.lds_bytes) == (name, vendor, warp_size, lds_bytes)
    assert spec.compute_units > 0 and spec.description and spec.family
    assert spec.dtypes and set(spec.warp_tiles) == set(spec.dtypes)
    for dtype, tiles in spec.warp_tiles.items():
        assert tiles and all(len(t) == 3 and min(t) > 0 for t in tiles), dtype
    assert spec.wave_layouts and all(len(w) == 3 and min(w) > 0 for w in spec.wave_layouts)
    assert len(set(map(tuple, spec.wave_layouts))) == len(spec.wave_layouts), "repeated wave layout"
    assert spec.pipelines and set(spec.pipeline_lds_limit) == set(spec.pipelines)
    if pipelines is not None:
        assert set(spec.pipelines) == set(pipelines)
    assert all(0 < v <= spec.lds_bytes for v in spec.pipeline_lds_limit.values())
    if "fmha" in spec.extras:
        assert set(spec.extras["fmha"]["hdims"]) <= set(spec.extras["fmha"]["dtypes"])
    assert spec.peak["fp16_tflops"] > 0 and spec.peak["mem_gbs"] > 0
    assert spec.summary()["name"] == name

    class _OtherOp:
        op = "not-an-op"

    assert spec.reject(_OtherOp()) is None, "arch rules must ignore keys of ops they do not know"
    # -- the hook registers this record
    registered = plugin.ck_register_archs()
    assert [a.name for a in registered] == [name]
    assert registered[0].summary() == spec.summary()
    # -- Triton target
    assert spec.triton_target == tuple(target)
    try:
        import triton  # noqa: F401
    except ImportError:
        unchecked.append("gpu_target (no triton)")
    else:
        gpu = spec.gpu_target()
        assert (gpu.backend, gpu.arch, gpu.warp_size) == tuple(target)
    # -- entry point
    eps = [ep for ep in metadata.entry_points(group="ck_core.archs") if ep.name == name]
    if eps:
        assert len(eps) == 1, [ep.value for ep in eps]
        assert eps[0].value == plugin.__name__
        assert eps[0].dist.name == (distribution or f"ck-arch-{name}")
    else:
        unchecked.append(f"entry point (ck-arch-{name} is not pip-installed)")
    # -- the kernel space of each op plugin
    mgr = PluginManager(plugins=[plugin])
    wanted = list(ops) if ops is not None else sorted(mgr.ops())
    spaces = {}
    for op in wanted:
        if op not in mgr.ops():
            unchecked.append(f"the {op} space (its op plugin is not installed)")
            continue
        keys = enumerate_keys(op, name, manager=mgr)
        assert keys, f"no {op} kernel is legal on {name}"
        assert {k.fields["dtype"] for k in keys if "dtype" in k.fields} <= set(spec.dtypes)
        assert len({k.name for k in keys}) == len(keys), "two keys share a name"
        for k in keys:
            assert k.arch == name
            assert spec.reject(k) is None, k.name
        for k in keys[:: max(1, len(keys) // 200)]:
            assert KernelKey.from_name(k.name, manager=mgr) == k
        spaces[op] = keys
    if unchecked:
        pytest.skip("all else checked; not checked: " + "; ".join(unchecked))
    return spaces


def check_op_plugin(op_name: str, *, plugin=None, arch: str | None = None, problems=None,
                    manager=None, rng=None, max_round_trips: int = 200) -> dict:
    """Assert what every op plugin must satisfy; return a summary ``{"keys": n, "problems": n, ...}``.

    ``plugin``: the module holding the op's hooks, for a plugin that is not pip-installed (it is
    added to a fresh plugin manager; ``manager`` instead gives one); ``arch``: the arch to
    enumerate on (default ``gfx942`` when installed, else the kit's fake arch); ``problems``: the
    problems to dispatch (default: the op's ``ck demo`` cases).  Checks

    * the OpSpec: name, description, tensor names, callables, enumeration options with help;
    * the Problem class: frozen attrs, ``op`` equal to the op's name, every field with its own
      ``help`` metadata (``ck run <op> --help`` prints it), ``from_dict(to_dict())`` round trips;
    * the kernel space on ``arch``: non-empty, unique names starting with ``<op>_``, every key
      legal (``OpSpec.legal``), names and JSON records parsing back to the same key, a
      malformed record refused with a ConfigError;
    * each problem: candidates exist, ``supports_many`` agrees with ``supports``, the plan's keys
      support their stages, ``problem_options`` keeps every candidate, the numpy backend's result
      matches the float64 reference on fresh random inputs, and a poisoned output does not.
    """
    import attrs

    from .dispatcher import Dispatcher
    from .errors import ConfigError, MissingKernel
    from .key import KernelKey
    from .plugins import PluginManager, get_manager
    from .registry import Registry
    from .validate import compare_all

    extra = [plugin] if plugin is not None else []
    if manager is None:
        manager = PluginManager(plugins=extra) if extra else get_manager()
    if arch is None and "gfx942" not in manager.archs():   # no AMD arch plugin installed: the fake arch
        fake = make_fake_arch()
        manager, arch = PluginManager(plugins=[*extra, arch_plugin(fake)]), fake.name
    mgr = manager
    rng = rng if rng is not None else np.random.default_rng()
    # -- the record
    op = mgr.op(op_name)
    assert op.name == op_name and op.description, "an OpSpec needs its name and a one-line description"
    assert op.input_names and op.output_names, "an OpSpec names its input and output tensors"
    for name in ("enumerate", "format_name", "parse_name", "from_fields", "supports", "reference",
                 "make_inputs", "implement"):
        assert callable(getattr(op, name)), f"OpSpec.{name} is not callable"
    assert op.options and all(isinstance(v, str) and v for v in op.options.values()), \
        "each enumeration option needs a one-line help (ck list <op> --help prints it)"
    # -- the problem class
    cls = op.problem_type
    assert attrs.has(cls) and getattr(cls, "op", None) == op_name, f"{cls.__name__}.op must be {op_name!r}"
    helps = {f.name: (f.metadata or {}).get("help", "") for f in attrs.fields(cls)}
    missing = [n for n, h in helps.items() if not (isinstance(h, str) and h.strip())]
    assert not missing, f"{cls.__name__} fields without attrs.field(metadata={{'help': ...}}): {missing}"
    same = sorted(n for n, h in helps.items() if list(helps.values()).count(h) > 1)
    assert not same, f"{cls.__name__} fields sharing one help text: {same}"
    # -- the kernel space
    arch = arch or "gfx942"
    archspec = mgr.arch(arch)
    full = Registry.from_enumeration(op_name, arch, "numpy", manager=mgr)
    keys = list(full)
    assert keys, f"no {op_name} kernel enumerates on {arch}"
    names = [k.name for k in keys]
    assert len(set(names)) == len(names), "two keys share a name"
    assert all(n.startswith(op_name + "_") for n in names), f"kernel names must start with {op_name}_"
    step = max(1, len(keys) // max_round_trips)
    for k in keys[::step]:
        assert k.op == op_name and k.arch == arch and k.backend == "numpy"
        if op.legal is not None:
            assert op.legal(k, archspec) is None, f"{k.name}: enumerated, yet legal() says {op.legal(k, archspec)}"
        assert KernelKey.from_name(k.name, manager=mgr) == k, f"{k.name} does not parse back"
        assert KernelKey.from_dict(k.to_dict(), manager=mgr) == k, f"{k.name}: its JSON record does not"
    bad = keys[0].to_dict()
    bad["signature"] = dict(bad["signature"], not_a_field=1)
    try:
        KernelKey.from_dict(bad, manager=mgr)
    except ConfigError:
        pass
    else:
        raise AssertionError("from_fields accepted a record with an unknown field")
    # -- problems
    if problems is None:
        problems = [c.problem for found in mgr.hook.ck_demo_cases() for c in found or () if c.op == op_name]
    assert problems, f"give problems= (no ck demo case of {op_name} is installed)"
    disp = Dispatcher(full, backend="numpy")
    for p in problems:
        assert type(p).from_dict(p.to_dict()) == p, f"{p}: from_dict(to_dict()) differs"
        steps = op.plan(p) if op.plan else [(op.name, p)]
        for _, sub in steps:
            cands = full.candidates(sub, "numpy")
            if not cands:
                raise MissingKernel(f"no {op_name} kernel on {arch} supports {sub}")
            sample = tuple(keys[:: max(1, len(keys) // 500)])
            if op.supports_many is not None:
                many = list(op.supports_many(sample, sub))
                assert many == [op.supports(k, sub) is None for k in sample], "supports_many disagrees with supports"
            if op.problem_options is not None:
                narrow = Registry.from_enumeration(op_name, arch, "numpy", manager=mgr, **op.problem_options(p))
                assert {k.name for k in narrow.candidates(sub, "numpy")} == {k.name for k in cands}, \
                    f"problem_options({p}) drops candidates of {sub}"
        plan = disp.plan(p)
        for st in plan.stages:
            assert op.supports(st.key, st.problem) is None, f"the plan runs {st.key.name}, which does not support it"
        report = check_against_reference(disp, p, rng)
        assert report.passed, f"{p}: {report}"
        # a wrong output must fail the same comparison (the tolerance is not loose enough to pass anything)
        inputs = op.make_inputs(p, rng)
        ref = op.reference(p, inputs)
        outs = disp.run_dict(p, dict(inputs))
        poisoned = {k: np.asarray(outs[k], dtype=np.float64) for k in ref}
        name = next(iter(ref))
        flat = poisoned[name].reshape(-1)
        if flat.size:
            flat[int(rng.integers(flat.size))] += 10.0 * (1.0 + np.abs(flat).max())
            tol = op.tolerance(p) if op.tolerance else {}
            dtypes = {k: getattr(p, "dtype_c", getattr(p, "dtype", "fp32")) for k in ref}
            assert not compare_all(poisoned, ref, dtypes, tol).passed, f"{p}: a poisoned {name!r} passed"
    return {"op": op_name, "arch": arch, "keys": len(keys), "problems": len(problems)}


def run_compiled(argv, env: "dict | None" = None, timeout: float = 900):
    """Run ``python *argv`` (``["-c", SCRIPT, *args]`` or a script file and its arguments) in a
    fresh process outside Triton's interpreter (``TRITON_INTERPRET`` removed: the script compiles
    real kernels), ``env`` added to the environment; returns the JSON the script printed after
    ``RESULT`` (its last such line).  A failing run fails the test with the end of its stderr."""
    import json
    import subprocess

    full = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    full.update(env or {})
    r = subprocess.run([sys.executable, *map(str, argv)], env=full, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT")]
    assert lines, f"no RESULT line in the output: {(r.stdout + r.stderr)[-3000:]}"
    return json.loads(lines[-1][len("RESULT"):])


def skip_unless_backend(backend: str, device: str, arch: str) -> None:
    """Skip the calling test unless it can run ``backend`` on ``device`` for ``arch``: Triton on the CPU
    needs TRITON_INTERPRET=1, on "cuda" a GPU (and CK_TEST_GPU=1); ``arch``'s plugin must be installed."""
    if backend == "triton":
        pytest.importorskip("triton")
        from .backends.triton_backend import interpreting

        if device == "cpu" and not interpreting():
            pytest.skip("the CPU variant runs the Triton kernels under TRITON_INTERPRET=1")
        if device == "cuda":
            import torch

            if interpreting() or not torch.cuda.is_available():
                pytest.skip("needs a CUDA GPU and CK_TEST_GPU=1")
    from .plugins import get_manager

    if arch not in get_manager().archs():
        pytest.skip(f"arch plugin {arch} is not installed")


class InterpReplay:
    """A recorded launch for CPU tests of the warm paths: replaying it launches the kernel in Triton's
    interpreter with the arguments given (the GPU replay's interface: ``args``, ``slot``, ``kernel``)."""

    def __init__(self, fn, grid, args, kwargs):
        self.fn, self.grid = fn, grid
        self.names = tuple(fn.arg_names)
        self.args = list(args) + [kwargs[n] for n in self.names[len(args):]]
        self.calls = 0

    def __call__(self, args):
        self.calls += 1
        self.fn[self.grid](*args)

    @property
    def kernel(self):
        return None

    def slot(self, name):
        return self.names.index(name)

    def release(self, slots=None):
        import torch

        for i in (range(len(self.args)) if slots is None else slots):
            if slots is not None or isinstance(self.args[i], torch.Tensor):
                self.args[i] = None


def interp_record(made: list):
    """A stand-in for ``ck_core.backends.triton_replay.record`` that launches (through ``via``
    where given) and appends an :class:`InterpReplay` of the launch to ``made``."""
    def record(fn, grid, args, kwargs, name=None, extra=None, via=None):
        (fn[grid] if via is None else via(fn, grid))(*args, **kwargs)
        made.append(InterpReplay(fn, grid, args, kwargs))
        return made[-1]
    return record


class Allocations:
    """``with Allocations() as allocs:`` weak references to every storage that a torch operation of this
    thread creates inside the block (factories and copies: not views or in-place results), for tests that
    nothing a call allocated outlives it in a cache or a closure: what breaks
    ``torch.compile(mode="reduce-overhead")``, whose CUDA-graph trees route a compiled graph's
    allocations into the graph's private pool and refuse any tensor alive there but its outputs.

    :meth:`alive` (after the caller dropped the call's outputs): ``[(op, frames)]`` of the storages
    still alive, other than those of the tensors given (the inputs), after ``gc.collect()``;
    ``frames``: the allocating call's innermost frames in ck_* packages.  Buffers that
    :func:`ck_core.memory.persistent` made are not seen (they are allocated in a helper thread, as
    they are outside any graph's pool)."""

    def __init__(self):
        self._refs: list = []

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        refs = self._refs

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                import torch
                from torch.multiprocessing.reductions import StorageWeakRef

                impl = _custom_op_impl(func)
                if impl is not None:   # a custom op (torch.library.custom_op): its implementation's operations
                    with _Mode():
                        out = impl(*args, **(kwargs or {}))
                else:
                    out = func(*args, **(kwargs or {}))
                # new storages only: not a view's or an in-place result's (its input's storage)
                given = set()
                for a in torch.utils._pytree.tree_leaves((args, kwargs)):
                    if isinstance(a, torch.Tensor):
                        given.add(a.untyped_storage()._cdata)
                    elif isinstance(a, torch.UntypedStorage):
                        given.add(a._cdata)
                for t in (out if isinstance(out, (tuple, list)) else (out,)):
                    if isinstance(t, torch.Tensor) and t.device.type != "meta" \
                            and t.untyped_storage()._cdata not in given:
                        refs.append((StorageWeakRef(t.untyped_storage()),
                                     f"{func} {tuple(t.shape)} {str(t.dtype).replace('torch.', '')}", _ck_frames()))
                return out

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)

    def alive(self, *keep) -> list:
        import gc

        from torch.multiprocessing.reductions import StorageWeakRef

        gc.collect()
        skip = {StorageWeakRef(t.untyped_storage()).cdata for t in keep if t is not None}
        seen, out = set(), []
        for ref, op, frames in self._refs:
            if ref.cdata in skip or ref.cdata in seen or ref.expired():
                continue
            seen.add(ref.cdata)
            out.append((op, frames))
        return out


def _custom_op_impl(func):
    """The Python function a ``torch.library.custom_op`` runs, or None for other operations."""
    from torch._library.custom_ops import OPDEFS

    op = OPDEFS.get(f"{func.namespace}::{func._opname}")
    return None if op is None else op._init_fn


def _ck_frames(n: int = 4) -> tuple:
    """The innermost ``n`` frames of the calling stack in ck_* packages (``file:line function``)."""
    import traceback

    frames = [f for f in traceback.extract_stack()[:-2]
              if ("/ck_" in f.filename or "/ck_core/" in f.filename) and "testing.py" not in f.filename]
    return tuple(f"{f.filename.rsplit('/', 2)[-2]}/{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}"
                 for f in frames[-n:])


def interp_replays(monkeypatch) -> list:
    """Route CPU tensors as GPU ones go (``triton_replay.replayable`` says yes) with every recorded
    launch an :class:`InterpReplay` (:func:`interp_record`): returns the list they are appended to.
    ``monkeypatch`` undoes it after the test."""
    from .backends import triton_replay

    made: list = []
    monkeypatch.setattr(triton_replay, "replayable", lambda t: True)
    monkeypatch.setattr(triton_replay, "record", interp_record(made))
    return made
