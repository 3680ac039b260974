"""The conv part of ``ck sweep conv``: testing matrix, CSV columns, the cuDNN peer (forward)."""
from __future__ import annotations

from importlib.resources import files

from ck_core.sweep import cast_inputs, SweepSpec

PROBLEM_FIELDS = ("direction", "dtype", "N", "G", "C", "K", "input_spatial", "filter", "stride", "dilation",
                  "pad_left", "pad_right", "in_layout")
KERNEL_FIELDS = ("ndim", "layout", "pipeline", "specialization", "tile_m", "tile_n", "tile_k", "warp_m", "warp_n",
                 "warp_k", "warp_tile_m", "warp_tile_n", "warp_tile_k", "stages", "reduction", "rows",
                 "vector_a", "vector_b", "vector_c")


def _torch_forward(problem, x, w):
    """(N, K, *out) = conv(x, w) in torch's layout, over views of our channels-last tensors."""
    import torch.nn.functional as F

    nd = problem.ndim
    xt = x.flatten(-2, -1).permute(0, nd + 1, *range(1, nd + 1))
    wt = w.flatten(0, 1).permute(0, nd + 1, *range(1, nd + 1))
    conv = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
    return conv(xt, wt, stride=problem.stride, padding=problem.pad_left, dilation=problem.dilation,
                groups=problem.G)


def _torch_ok(problem, tensors) -> bool:
    x = tensors.get("x")
    return (problem.direction == "forward" and problem.layout_family == "nhwgc"
            and problem.pad_left == problem.pad_right
            and getattr(getattr(x, "device", None), "type", None) == "cuda")


def peer(problem, tensors):
    """cuDNN through torch on the same memory (forward, symmetric padding); else no peer."""
    if not _torch_ok(problem, tensors):
        return None
    x, w = tensors["x"], tensors["w"]
    return "torch conv (cuDNN)", lambda: _torch_forward(problem, x, w)


def device_reference(problem, tensors):
    """y in fp32 on the GPU, back in our (N, *out, G, K/G) layout."""
    if not _torch_ok(problem, tensors):
        return {}
    nd = problem.ndim
    y = _torch_forward(problem, tensors["x"].float(), tensors["w"].float())
    y = y.permute(0, *range(2, nd + 2), 1)
    return {"y": y.unflatten(-1, (problem.G, problem.K // problem.G))}


def device_inputs(problem, tensors):
    return cast_inputs(("x", "w", "dy"), problem.dtype, tensors)


def sweep_spec() -> SweepSpec:
    return SweepSpec(op="conv", shapes=str(files("ck_conv") / "sweep_shapes.toml"),
                     problem_fields=PROBLEM_FIELDS, kernel_fields=KERNEL_FIELDS,
                     peer=peer, device_reference=device_reference,
                     device_inputs=device_inputs)
