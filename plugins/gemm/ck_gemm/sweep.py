"""The GEMM part of ``ck sweep gemm``: testing matrix, CSV columns, the cuBLAS peer."""
from __future__ import annotations

from importlib.resources import files

from ck_core.sweep import cast_inputs, SweepSpec

PROBLEM_FIELDS = ("batch", "m", "n", "k", "dtype", "dtype_c", "layout")
KERNEL_FIELDS = ("pipeline", "variant", "tile_m", "tile_n", "tile_k", "warp_m", "warp_n", "warp_k",
                 "warp_tile_m", "warp_tile_n", "warp_tile_k", "stages", "split_k", "group_m",
                 "pad_m", "pad_n", "pad_k", "epilogue", "scheduler")


def _plain(problem) -> bool:
    return problem.num_d == 0 and problem.activation == "none"


def _logical(problem, a, b):
    """torch views of A (.., M, K) and B (.., K, N) over the stored tensors (no copies)."""
    a = a if problem.layout[0] == "r" else a.transpose(-1, -2)
    b = b if problem.layout[1] == "r" else b.transpose(-1, -2)
    return a, b


def _on_gpu(tensors) -> bool:
    a = tensors.get("a")
    return getattr(getattr(a, "device", None), "type", None) == "cuda"


def peer(problem, tensors):
    """torch.matmul (cuBLAS) on the same tensors; no peer off the GPU or with an epilogue."""
    if not _on_gpu(tensors) or not _plain(problem) or problem.dtype not in ("fp16", "bf16", "fp32"):
        return None
    import torch

    a, b = _logical(problem, tensors["a"], tensors["b"])
    return "torch.matmul (cuBLAS)", lambda: torch.matmul(a, b)


def device_reference(problem, tensors):
    """C in fp32 on the GPU (for shapes too large for the float64 check)."""
    if not _on_gpu(tensors) or not _plain(problem) or problem.dtype == "int8":
        return {}
    import torch

    a, b = _logical(problem, tensors["a"].float(), tensors["b"].float())
    c = torch.matmul(a, b)
    return {"c": c if problem.layout[2] == "r" else c.transpose(-1, -2).contiguous()}


def device_inputs(problem, tensors):
    return cast_inputs(("a", "b"), problem.dtype, tensors)


def sweep_spec() -> SweepSpec:
    return SweepSpec(op="gemm", shapes=str(files("ck_gemm") / "sweep_shapes.toml"),
                     problem_fields=PROBLEM_FIELDS, kernel_fields=KERNEL_FIELDS,
                     peer=peer, device_reference=device_reference,
                     device_inputs=device_inputs)
