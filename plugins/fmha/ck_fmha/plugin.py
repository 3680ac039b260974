"""Hook implementations of the FMHA op plugin (entry point group ``ck_core.ops``).

Kernel spaces, one per (arch, backend) -- a key's ``arch`` and ``backend`` say which
(:func:`_space`), never the type of its signature:
* archs with CK FMHA tables (gfx90a, gfx942, gfx950, gfx1100, gfx1201), every backend but
  triton: CK's 01_fmha codegen rules (:mod:`ck_fmha.codegen`), per receipt;
* the triton backend, and archs without CK tables: the Triton templates' configurations
  (:mod:`ck_fmha.backends.triton.keys`).
"""
from __future__ import annotations

from pathlib import Path

from ck_core.errors import UnsupportedProblem
from ck_core.hookspecs import hookimpl
from ck_core.records import OpSpec

from . import features, footprint, heuristics, keys, plan as stages
from .codegen import ARCHES as CK_ARCHES
from .problem import FmhaProblem

from .plan import INPUTS, OUTPUTS  # noqa: E402  (the op's tensor vocabulary)


def _triton_keys():
    from .backends.triton import keys as triton_keys

    return triton_keys


def _triton_implement():
    from .backends.triton import implement

    return implement


class _CkSpace:
    """CK's codegen rules as a key space (the functions of :mod:`ck_fmha.keys`)."""
    enumerate_keys = staticmethod(keys.ck_keys)

    @staticmethod
    def legal(key, arch):
        return keys.ck_legal(key.signature, arch)

    @staticmethod
    def supports(key, problem):
        return keys.ck_supports(key.signature, problem)

    @staticmethod
    def rank(problem, candidates, arch):
        return keys.ck_rank(problem, candidates)


def _space(arch_name: str, backend: str):
    """The key space of (arch, backend): CK's rules where the arch has CK tables and the backend
    is not triton, the Triton templates' otherwise."""
    return _CkSpace if backend != "triton" and arch_name in CK_ARCHES else _triton_keys()


def enumerate_keys(arch, backend, options):
    return _space(arch.name, backend).enumerate_keys(arch, backend, options)


def format_name(sig, alg):
    return sig.name_body(alg)


def parse_name(body, arch, backend):
    """(signature, algorithm) of a key's name body: the space of the name's arch and backend parses
    it (a CK-rule body takes its arch from there)."""
    space = _space(arch, backend)
    return keys.parse_ck(body, arch) if space is _CkSpace else space.parse_name(body)


def from_fields(sig: dict, alg: dict):
    """(signature, algorithm) of untrusted JSON field dicts, every field checked."""
    if isinstance(sig, dict) and "tile" in sig and "arch" in sig:
        return keys.ck_from_fields(sig, alg)
    return _triton_keys().from_fields(sig, alg)


def legal(key, arch):
    """Why the enumeration rules would not produce ``key`` on ``arch`` (or None)."""
    space = _space(key.arch, key.backend)
    if (space is _CkSpace) != hasattr(key.signature, "ck_name"):   # a key built by hand in the other space
        want = "CK-rule" if space is _CkSpace else "Triton"
        return f"{key.name}: {key.arch}/{key.backend} keys are {want} keys"
    return space.legal(key, arch)


def supports(key, problem):
    return _space(key.arch, key.backend).supports(key, problem)


def selection_family(problem, arch, backend):
    """The Triton keys' selection family (:func:`ck_fmha.heuristics.selection_family`); CK-rule keys have
    none: their ranking reads each length's divisibility by the tiles (padding specialisations) and its
    padded waste, so every problem is selected in full there."""
    if _space(arch.name, backend) is _CkSpace:
        return None
    return heuristics.selection_family(problem)


def heuristic(problem, candidates, arch):
    if not candidates:
        return []
    return _space(candidates[0].arch, candidates[0].backend).rank(problem, candidates, arch)


def implement(key, backend, arch):
    if backend == "numpy":
        return _numpy_stage
    if backend == "triton":
        from ck_core.backends.triton_backend import refuse_interpreted_bf16

        refuse_interpreted_bf16(key.signature.dtype, key.name)
        return _triton_implement().make_launcher(key)
    raise UnsupportedProblem(f"fmha has no {backend!r} implementation; use numpy or triton")


def _numpy_stage(problem, tensors):
    stages.check_tensor_names(problem, tensors)
    return stages.run_stage(problem, tensors)


def _render(key, backend):
    return _triton_implement().render(key, backend)


def _bench(peer, options):
    if options.get("suite", "core") == "broad":
        from .bench_broad import bench
    else:
        from .bench import bench

    return bench(peer, options)


def problem_options(p) -> dict:
    """The families of ``p``'s plan (split-KV adds its combine, a backward its three stages):
    the part of the space that can run every stage (both backends' spaces take the option)."""
    return {"families": tuple(dict.fromkeys(sub.family for _, sub in stages.plan(p)))}


def fmha_op() -> OpSpec:
    return OpSpec(
        name="fmha", problem_type=FmhaProblem, enumerate=enumerate_keys, format_name=format_name,
        parse_name=parse_name, from_fields=from_fields, legal=legal, supports=supports,
        reference=stages.reference, make_inputs=stages.make_inputs, implement=implement,
        input_names=INPUTS, output_names=OUTPUTS, plan=stages.plan, render=_render, bench=_bench,
        flops=stages.flops, heuristic=heuristic, features=features.features, tolerance=stages.tolerance,
        bytes_moved=footprint.bytes_moved, working_bytes=footprint.working_bytes,
        problem_options=problem_options, selection_family=selection_family,
        tuning_data=str(Path(__file__).resolve().parent / "tuned"),
        families=("fwd", "fwd_splitkv", "fwd_splitkv_combine", "fwd_pagedkv", "fwd_appendkv",
                  "batch_prefill", "bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq"),
        description="fused multi-head attention: nine CK families, multi-stage plans",
        options={
            "receipt": "CK's kernel list by number or name: 0 ck_default, 1 ck_extended, 2 flash_fwd, "
                       "3 flash_bwd, 4 pytorch, 100/200/300/400 aiter_*, 600 aiter_cpp, 800/801 fp32_*, "
                       "888 fp8_test (default 0)",
            "family": "one family (also a problem field): fwd, fwd_splitkv, bwd_dq_dk_dv ...",
            "families": "several families, e.g. fwd,fwd_splitkv",
            "mask_impl": "generic or simplified mask kernels (CK backend space)",
            "batch_prefill_64bit": "batch-prefill kernels with 64-bit page loads (true/false)",
            "config": "a tile-engine sweep config (JSON or TOML allow-lists) narrowing the space",
            "dtypes": "triton backend: fp16, bf16, fp8",
        },
    )


@hookimpl
def ck_register_ops():
    return [fmha_op()]


@hookimpl
def ck_demo_cases():
    from .demo import demo_cases

    return demo_cases()


@hookimpl
def ck_declare_knobs():
    from ck_core.knobs import Knob

    return [Knob("CK_FMHA_GLUON_DKDV", str, "",
                 "FMHA backward on Hopper: '1' runs every dK/dV on the Gluon kernel, '0' none (also not "
                 "the fused dK/dV+dQ kernel of deterministic=False); unset: the tuned tables "
                 "(bwd_gluon_dkdv, bwd_gluon_fused of ck_fmha/tuned/sm90.json).")]


@hookimpl
def ck_sweep_spec(op):
    if op.name == "fmha":
        from .sweep import sweep_spec

        return sweep_spec()
    return None


@hookimpl
def ck_api_registry(op, arch, backend, options):
    """The public torch API's registry: the keys of the space of (arch, backend) (:func:`_space`),
    the one that judges them: CK's rules for the numpy backend on an arch with CK tables (CPU
    tensors without the interpreter: the numpy backend runs the reference for the chosen key), the
    Triton templates' otherwise; under TRITON_INTERPRET=1 without the Hopper-only forms (TMA,
    Gluon), which the interpreter cannot run.  ``options`` are the API's narrowing (families,
    dtypes, hdims).  The Dispatchers are built once per process: ``ck_core.api.clear()`` after
    changing it."""
    if op != "fmha":
        return None
    from ck_core.registry import Registry

    if _space(arch.name, backend) is _CkSpace:
        return Registry(arch.name, _ck_api_keys(arch, backend, dict(options)))
    tk = _triton_keys()
    keys = tk.enumerate_keys(arch, backend, dict(options))
    if backend == "triton" and tk.interpreting():   # the interpreter runs pointer-load Triton kernels only
        keys = [k for k in keys if k.algorithm.variant not in tk.CUDA_ONLY and not k.algorithm.dq.startswith("gluon")]
    return Registry(arch.name, keys)


def _ck_api_keys(arch, backend, options: dict) -> list:
    """The CK-rule keys of the API's narrowing: ``families`` enumerated, then the keys of one of
    ``dtypes`` whose head dims hold one of ``hdims`` (equal, or padded up to)."""
    dtypes = options.pop("dtypes", None)
    hdims = options.pop("hdims", None)
    out = []
    for k in keys.ck_keys(arch, backend, options):
        s = k.signature
        if dtypes and not any(keys.dtype_ok(s.dtype, d) for d in dtypes):
            continue
        if hdims and not any(keys.hdims_ok(s, hq, hv) for hq, hv in hdims):
            continue
        out.append(k)
    return out
