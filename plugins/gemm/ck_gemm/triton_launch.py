"""Bridge between GEMM kernel keys and the Triton templates in ``ck_gemm.triton``.

* :func:`config_of` maps a key's algorithm onto a Triton ``GemmConfig``;
* :func:`render` gives the triton backend something to AOT-compile;
* :func:`make_launcher` gives the dispatcher a callable for a key: it caches
  the config and launches the template directly (no re-selection per call).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
from typing import Optional

import attrs

from ck_core.errors import InvalidProblem, UnsupportedProblem

from .kernel import GemmAlgorithm

#: Triton pipelining depth per CK pipeline when a key sets no explicit stages
DEFAULT_STAGES = {"mem": 2, "compv3": 2, "compv4": 3}


def config_of(key):
    from .triton.configs import GemmConfig

    a: GemmAlgorithm = key.algorithm
    return GemmConfig(block_m=a.tile_m, block_n=a.tile_n, block_k=a.tile_k, group_m=a.group_m,
                      num_warps=a.num_warps, num_stages=a.stages or DEFAULT_STAGES.get(a.pipeline, 3),
                      variant="plain" if a.variant == "tile" else a.variant, split_k=a.split_k)


def algorithm_for_config(cfg, arch, dtype: str, pipeline: str) -> Optional[GemmAlgorithm]:
    """A legal CK-style algorithm record for a Triton config on ``arch`` (None if none fits)."""
    for wave in arch.wave_layouts:
        if wave[0] * wave[1] * wave[2] != cfg.num_warps:
            continue
        for wt in arch.warp_tiles.get(dtype, ()):
            if cfg.block_m % (wave[0] * wt[0]) or cfg.block_n % (wave[1] * wt[1]) \
                    or cfg.block_k % (wave[2] * wt[2]):
                continue
            return GemmAlgorithm(cfg.block_m, cfg.block_n, cfg.block_k, *wave, *wt,
                                 pipeline=pipeline, pad_m=True, pad_n=True, pad_k=True,
                                 split_k=cfg.split_k, stages=cfg.num_stages,
                                 variant="tile" if cfg.variant == "plain" else cfg.variant,
                                 group_m=cfg.group_m)
    return None


@functools.lru_cache(maxsize=None)
def _template_hash() -> str:
    from .triton import aot, kernels

    src = inspect.getsource(kernels) + inspect.getsource(aot)
    return hashlib.sha256(src.encode()).hexdigest()


@attrs.frozen
class TritonRendered:
    spec: object
    source_hash: str
    options: dict

    def compile(self, target, extra_options=None):
        spec = self.spec
        if extra_options:
            spec = dataclasses.replace(spec, options={**spec.options, **extra_options})
        return spec.compile(target)


def _spec(key):
    from .triton.aot import kernel_for

    s = key.signature
    return kernel_for(config_of(key), dtype=s.dtype, layout=s.layout, out_dtype=s.dtype_c,
                      num_d=s.num_d, d_op=s.d_op, activation=s.activation)


def render(key, backend: str):
    if backend == "triton":
        spec = _spec(key)
        h = hashlib.sha256((_template_hash() + repr(sorted(spec.constexprs.items()))
                            + repr(spec.signature) + repr(spec.options)).encode()).hexdigest()
        return TritonRendered(spec, h, dict(spec.options))
    if backend == "ck":
        from .ck_template import render_ck

        return render_ck(key)
    raise UnsupportedProblem(f"gemm has no {backend} templates")


_TORCH_DT = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "fp8": "float8_e4m3fn",
             "bf8": "float8_e5m2", "int8": "int8", "int32": "int32"}


def torch_dtype(token: str):
    import torch

    return getattr(torch, _TORCH_DT[token])


def make_launcher(key):
    """A callable ``(problem, tensors) -> {"c": tensor}`` bound to this key's config."""
    from .triton.launch import gemm

    cfg = config_of(key)
    sig = key.signature
    t_in, t_out = torch_dtype(sig.dtype), torch_dtype(sig.dtype_c)
    act = None if sig.activation == "none" else sig.activation

    def launch(problem, tensors):
        a, b = tensors["a"], tensors["b"]
        if a.dtype != t_in:   # numpy storage (float32 for bf16/fp8) arriving through to_backend
            a, b = a.to(t_in), b.to(t_in)
        ds = tuple(tensors[f"d{i}"] for i in range(problem.num_d))
        ds = tuple(d if d.dtype == t_out else d.to(t_out) for d in ds)
        if tuple(a.shape[-2:]) != problem.shape_a()[-2:] or tuple(b.shape[-2:]) != problem.shape_b()[-2:]:
            raise InvalidProblem(f"tensor shapes {tuple(a.shape)} / {tuple(b.shape)} do not match "
                                 f"{problem.shape_a()} / {problem.shape_b()} ({problem.layout})")
        c = gemm(a, b, layout=problem.layout, config=cfg, d_tensors=ds, d_op=problem.d_op,
                 activation=act, out_dtype=t_out)
        return {"c": c}

    return launch
