"""Every hook of ck-dispatcher, grouped by phase.

A plugin is a module (or object) with functions decorated by
``ck_core.hookimpl`` and named like the specs below.  Plugins are found through
the entry-point groups ``ck_core.ops``, ``ck_core.archs`` and
``ck_core.backends``; the built-in numpy backend loads through the same path.

Phases: register -> enumerate -> render/compile -> select -> launch; then the
public APIs, the demo and the knobs.
"""
from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("ck_core")
hookimpl = pluggy.HookimplMarker("ck_core")


# --- register --------------------------------------------------------------

@hookspec
def ck_register_ops():
    """Return a list of :class:`ck_core.OpSpec` this plugin provides.

    Not firstresult: every plugin's lists are concatenated.  Two plugins
    returning an op with the same ``name`` is a PluginError naming both.

    Example::

        @hookimpl
        def ck_register_ops():
            return [OpSpec(name="gemm", problem_type=GemmProblem, ...)]
    """


@hookspec
def ck_register_archs():
    """Return a list of :class:`ck_core.ArchSpec` this plugin provides.

    Not firstresult.  Arch names must be unique across all plugins.

    Example::

        @hookimpl
        def ck_register_archs():
            return [ArchSpec(name="gfx942", vendor="amd", family="cdna3", warp_size=64, ...)]
    """


@hookspec
def ck_register_backends():
    """Return a list of :class:`ck_core.BackendSpec` this plugin provides.

    Not firstresult.  Backend names must be unique.

    Example::

        @hookimpl
        def ck_register_backends():
            return [BackendSpec(name="numpy", available=lambda: (True, ""), ...)]
    """


# --- enumerate -------------------------------------------------------------

@hookspec
def ck_extra_kernels(op, arch, backend, options):
    """Return extra :class:`ck_core.KernelKey` objects for ``op`` on ``arch``.

    Not firstresult: lets any plugin add kernels to another plugin's op (for
    example an arch plugin with hand-tuned tiles).  ``op`` is an OpSpec, ``arch``
    an ArchSpec, ``backend`` a backend name, ``options`` the enumeration options
    dict.  The keys still pass the arch rules.

    Example::

        @hookimpl
        def ck_extra_kernels(op, arch, backend, options):
            if op.name == "gemm" and arch.name == "gfx942":
                return [KernelKey.from_name("gemm_fp16_rcr_...")]
    """


@hookspec
def ck_reject_kernel(key, arch):
    """Return a reason string when ``key`` is illegal on ``arch``, else None.

    Not firstresult: all answers are collected, and any reason culls the key
    (logged at debug level).  ArchSpec.rules run too; this hook lets a plugin
    add rules to an arch it does not own.

    Example::

        @hookimpl
        def ck_reject_kernel(key, arch):
            if arch.name == "gfx1100" and key.fields.get("pipeline") == "compv4":
                return "compv4 needs the gfx9 LDS layout"
    """


# --- render / compile --------------------------------------------------------

@hookspec(firstresult=True)
def ck_compile_options(key, arch, backend):
    """Return a dict of extra compile options for one kernel, or None.

    firstresult: the first non-None answer wins.  The options become part of
    the cache key (for example ``{"maxnreg": 128}`` on the triton backend).

    Example::

        @hookimpl
        def ck_compile_options(key, arch, backend):
            return {"maxnreg": 168} if arch.vendor == "nvidia" else None
    """


# --- select ---------------------------------------------------------------

@hookspec(firstresult=True)
def ck_rank_candidates(problem, candidates, arch):
    """Return ``candidates`` (KernelKeys that support ``problem``) best first, or None.

    firstresult: the first plugin that answers decides; when none does, the
    op's own heuristic ranks, else first-fit (registry order).  The tuning
    table, when it has an entry, overrides every heuristic.

    Example::

        @hookimpl
        def ck_rank_candidates(problem, candidates, arch):
            return sorted(candidates, key=lambda k: -k.fields["tile_m"])
    """


# --- launch -----------------------------------------------------------------

@hookspec
def ck_after_run(problem, plan, seconds, launched):
    """Observe a finished ``Dispatcher.run``; return value ignored.

    Not firstresult.  ``plan`` is the executed :class:`ck_core.Plan`,
    ``launched`` the tuple of the kernel names the Dispatcher launched, in
    launch order (one per stage: what ran, not what was asked for), and
    ``seconds`` the host wall time of the call (launch time on GPUs, which
    run asynchronously).  Keep it cheap: it is on the hot path.  An
    implementation may take any subset of the arguments.

    Example::

        @hookimpl
        def ck_after_run(plan, launched):
            for name in launched:
                STATS[name] += 1
    """


# --- public APIs, demo, knobs ------------------------------------------------

@hookspec(firstresult=True)
def ck_api_registry(op, arch, backend, options):
    """Return the :class:`ck_core.Registry` the public API of ``op`` dispatches through, or None.

    firstresult.  ``op`` is an op name, ``arch`` an ArchSpec, ``backend`` a
    backend name, ``options`` the enumeration options of the signature family
    asked for (``OpSpec.api_options`` plus what the API call narrows, e.g. a
    dtype and layout).  Asked once per (plugin manager, op, arch, backend,
    options) by :func:`ck_core.api.dispatcher_for`; when nobody answers, the
    registry is the op's enumeration with ``options``.  Lets a deployment (or a
    test) restrict the kernels users' calls may select, e.g. to what it built.

    Example::

        @hookimpl
        def ck_api_registry(op, arch, backend, options):
            if op == "gemm":
                return Registry.import_json("my_gemms.json")
    """


@hookspec
def ck_demo_cases():
    """Return a list of :class:`ck_core.DemoCase` that ``ck demo`` dispatches and validates.

    Not firstresult: the cases of every plugin run, sorted by ``order``.

    Example::

        @hookimpl
        def ck_demo_cases():
            return [DemoCase("gemm", GemmProblem(m=257, n=131, k=199), order=0)]
    """


@hookspec
def ck_declare_knobs():
    """Return a list of :class:`ck_core.knobs.Knob` (environment variables) this plugin reads.

    Not firstresult.  Declared knobs are read with ``ck_core.knobs.get(name)``
    like the core's and listed by ``ck knobs``.  A name the core or another
    plugin already declares is a PluginError.

    Example::

        @hookimpl
        def ck_declare_knobs():
            return [Knob("CK_MYOP_FAST", knobs.parse_bool, False, "Take the fast path.")]
    """


# --- sweep (the tile engine) ---------------------------------------------------

@hookspec(firstresult=True)
def ck_sweep_spec(op):
    """Return a :class:`ck_core.sweep.SweepSpec` for ``op`` (an OpSpec), or None.

    firstresult: the first non-None answer wins.  The spec tells ``ck sweep``
    what the core cannot know about an op: its testing matrix (a TOML file of
    smoke / full / nightly shapes), the CSV columns that describe a problem and
    a kernel, how a seed-format kernel config maps onto the op's keys, and the
    peer (e.g. torch) that every shape is also timed with.  An op without a
    spec can still be swept with ``--shapes FILE``.

    Example::

        @hookimpl
        def ck_sweep_spec(op):
            if op.name == "gemm":
                return SweepSpec(op="gemm", shapes=str(files(__package__) / "sweep_shapes.toml"),
                                 problem_fields=("m", "n", "k"), ...)
    """
