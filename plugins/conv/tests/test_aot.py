"""Ahead-of-time compiles of the Triton conv kernels for NVIDIA and every AMD target, on a CPU.

The tests' conftest turns on TRITON_INTERPRET (its jit functions cannot be
compiled), so compiles run in one child process with the interpreter off.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

TARGETS = [("cuda", 90, 32), ("hip", "gfx942", 64), ("hip", "gfx90a", 64), ("hip", "gfx950", 64),
           ("hip", "gfx1100", 32), ("hip", "gfx1201", 32)]
FWD = "conv_fwd_fp16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_64x64x32_2x2x1_16x16x16_default"
MORE = ["conv_bwd_data_bf16_ndhwgc_gkzyxc_ndhwgk_3d_compv3_intrawave_64x64x32_2x2x1_16x16x16_filter3x3",
        "conv_bwd_weight_fp16_nhwgc_gkyxc_nhwgk_2d_mem_intrawave_64x64x32_2x2x1_16x16x16_filter1x1_pad0",
        "conv_fwd_fp32_nwgc_gkxc_nwgk_1d_compv3_intrawave_64x32x32_2x2x1_16x16x16_filter1x1_stride1_pad0",
        "conv_fwd_fp16_nhwgc_gkyxc_nhwgk_2d_mem_intrawave_128x32x1_4x1x1_1x1x1_depthwise",
        "conv_bwd_weight_fp16_nhwgc_gkyxc_nhwgk_2d_mem_intrawave_8x32x1_4x1x1_1x1x1_depthwise"]
PIPELINED = "conv_fwd_fp16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_64x64x64_2x2x1_16x16x16_filter3x3"
# the realisation knobs (split reductions, tap bits, stages, merged groups), each on
# the problem shape its launch would see, for Hopper and CDNA3
_P3 = dict(N=2, C=64, K=64, input_spatial=(9, 9), filter=(3, 3), pad_left=1, pad_right=1)
EXTENDED = [
    ("conv_fwd_fp16_nhwgc_gkyxc_nhwgk_2d_compv4_intrawave_128x128x64_2x4x1_16x16x16_filter3x3_fixup_tapmask", _P3),
    ("conv_fwd_fp16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_64x128x128_2x4x1_16x16x16_filter3x3_st4_twostage", _P3),
    ("conv_bwd_data_fp16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_64x128x64_2x4x1_16x16x16_filter3x3_fixup",
     dict(_P3, direction="bwd_data")),
    ("conv_bwd_weight_fp16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_128x128x128_2x4x1_16x16x16_filter3x3_st4_fixup"
     "_tapmask_sp2", dict(_P3, direction="bwd_weight", split_k=2)),
    ("conv_bwd_weight_fp16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_128x64x64_2x4x1_16x16x16_filter3x3_relaxed_sp2",
     dict(_P3, direction="bwd_weight", split_k=2)),
    ("conv_bwd_weight_fp16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_64x64x128_2x2x1_16x16x16_filter3x3_st5_atomicfix"
     "_tapmask_sp2", dict(_P3, direction="bwd_weight", split_k=2)),
    ("conv_bwd_weight_fp16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_16x16x64_2x2x1_16x16x16_filter3x3_fixup_gm8"
     "_tapmask_sp2", dict(_P3, G=16, C=256, K=256, direction="bwd_weight", split_k=2)),
    # session 3: bwd_data tap bits, stream-K (both directions, 3x3 and 1x1), flat-row depthwise
    ("conv_bwd_data_fp16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_64x128x64_2x2x1_16x16x16_filter3x3_tapmask",
     dict(_P3, direction="bwd_data")),
    ("conv_bwd_data_fp16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_64x128x128_2x4x1_16x16x16_filter3x3_st4_streamk"
     "_tapmask", dict(_P3, direction="bwd_data")),
    ("conv_fwd_fp16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_64x128x128_2x4x1_16x16x16_filter3x3_st4_streamk_tapmask",
     _P3),
    ("conv_bwd_data_fp16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_128x128x64_2x4x1_16x16x16_filter1x1_stride1_pad0"
     "_streamk", dict(_P3, filter=(1, 1), pad_left=0, pad_right=0, direction="bwd_data")),
    ("conv_fwd_fp16_nhwgc_gkyxc_nhwgk_2d_mem_intrawave_4x1024x1_4x1x1_1x1x1_depthwise_flat",
     dict(_P3, G=144, C=144, K=144)),
    ("conv_bwd_data_fp16_nhwgc_gkyxc_nhwgk_2d_mem_intrawave_2x2048x1_8x1x1_1x1x1_depthwise_flat",
     dict(_P3, G=144, C=144, K=144, direction="bwd_data")),
    # row-reuse depthwise forward (gathered weights / expanded table), the bench's 56x56x144 layer
    ("conv_fwd_fp16_nhwgc_gkyxc_nhwgk_2d_mem_intrawave_4x1024x1_4x1x1_1x1x1_depthwise_rows",
     dict(_P3, G=144, C=144, K=144, input_spatial=(56, 56))),
    ("conv_fwd_fp16_nhwgc_gkyxc_nhwgk_2d_mem_intrawave_8x2048x1_8x1x1_1x1x1_depthwise_rows_wexp",
     dict(_P3, G=144, C=144, K=144, input_spatial=(56, 56))),
    ("conv_fwd_fp16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_128x64x64_2x2x1_16x16x16_filter3x3_gm4_tapmask",
     dict(_P3, G=32, C=512, K=512)),
    ("conv_bwd_data_fp16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_128x64x64_2x2x1_16x16x16_filter3x3_gm4_tapmask",
     dict(_P3, G=32, C=512, K=512, direction="bwd_data")),
    ("splitk_reduce:bf16", None),
]

_CHILD = r'''
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ck_conv.backends.triton.aot import aot_source_args
from ck_conv.problem import ConvProblem
from ck_conv.backends.triton.aot import reduce_aot_source_args
out = []
for name, tgt, with_problem in json.loads(sys.argv[1]):
    if isinstance(with_problem, dict):
        p = ConvProblem(**with_problem)
    else:
        p = ConvProblem(N=2, C=64, K=64, input_spatial=(9, 9), filter=(3, 3), pad_left=1, pad_right=1) \
            if with_problem else None
    if name.startswith("splitk_reduce:"):
        fn, sig, consts, opts = reduce_aot_source_args(name.split(":")[1])
    else:
        fn, sig, consts, opts = aot_source_args(name, p)
    attrs = opts.pop("attrs")
    try:
        ck = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget(*tgt), options=opts)
        kind = "cubin" if "cubin" in ck.asm else "hsaco"
        ttgir = ck.asm.get("ttgir", "")
        ptx = ck.asm.get("ptx", "")
        out.append(dict(name=name, target=tgt, ok=True, kind=kind, size=len(ck.asm[kind]),
                        shared=int(ck.metadata.shared), async_copy="async_copy_global_to_local" in ttgir,
                        wgmma="warp_group_dot" in ttgir, acq_rel_counter="atom.global.gpu.acq_rel.add.u32" in ptx,
                        relaxed_atomics="atom.global.gpu.relaxed.add" in ptx, cg_loads="ld.global.cg" in ptx,
                        v4_stores="st.global.v4.b32" in ptx, v4_loads=len(re.findall(r"ld\.global[^;]*\.v4", ptx))))
    except Exception as e:
        out.append(dict(name=name, target=tgt, ok=False, error=f"{type(e).__name__}: {e}"[:500]))
print(json.dumps(out))
'''


def _compile_all(jobs):
    env = dict(os.environ, TRITON_INTERPRET="0")
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root.parents[1]), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(jobs)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def fast_builds():
    jobs = [[FWD, list(t), False] for t in TARGETS] + [[PIPELINED, ["cuda", 90, 32], True]]
    return _compile_all(jobs)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"{t[0]}-{t[1]}")
def test_forward_compiles_for_every_target(fast_builds, target):
    (res,) = [r for r in fast_builds if r["name"] == FWD and tuple(r["target"]) == target]
    assert res["ok"], res.get("error")
    assert res["kind"] == ("cubin" if target[0] == "cuda" else "hsaco") and res["size"] > 1000


def test_hopper_build_pipelines_with_known_alignment(fast_builds):
    """With the problem's channel counts known (multiples of 16), loads are async and multi-buffered."""
    (res,) = [r for r in fast_builds if r["name"] == PIPELINED]
    assert res["ok"], res.get("error")
    assert res["async_copy"] and res["wgmma"] and res["shared"] >= 2 * (64 * 64 + 64 * 64) * 2


@pytest.mark.slow
def test_other_kernels_compile_for_every_target():
    res = _compile_all([[n, list(t), False] for n in MORE for t in TARGETS])
    bad = [r for r in res if not r["ok"]]
    assert not bad, bad[:3]


@pytest.fixture(scope="module")
def extended_builds():
    return _compile_all([[n, list(t), p] for n, p in EXTENDED for t in (("cuda", 90, 32), ("hip", "gfx942", 64))])


@pytest.mark.parametrize("name", [n for n, _ in EXTENDED], ids=lambda n: n.split("_16x16x16_")[-1] + n[5:13])
def test_extended_kernels_compile_for_hopper_and_cdna3(extended_builds, name):
    res = [r for r in extended_builds if r["name"] == name]
    assert len(res) == 2 and all(r["ok"] for r in res), [r.get("error") for r in res]
    (h,) = [r for r in res if r["kind"] == "cubin"]
    if "_fixup" in name:  # workspace partials stored 16 B at a time, arrival counter, partials read at L2
        assert h["acq_rel_counter"] and h["cg_loads"] and h["v4_stores"]
    if "_relaxed" in name or "_atomicfix" in name:
        assert h["relaxed_atomics"]
    if "_atomicfix" in name:
        assert h["acq_rel_counter"] and h["cg_loads"]
    if "_fixup_tapmask" in name and "gm" not in name:
        assert h["async_copy"] and h["wgmma"]
    if "_streamk" in name:  # cut tiles finish like fixup; the main loop still pipelines into wgmma
        assert h["acq_rel_counter"] and h["cg_loads"] and h["v4_stores"] and h["async_copy"] and h["wgmma"]
    if "_tapmask" in name and not name.startswith("conv_bwd_weight"):  # incl. the block-diagonal gm4 ones
        assert h["async_copy"] and h["wgmma"]
    if name.endswith("_depthwise_flat"):  # every tap's rows load as 16-byte vectors (G = 144)
        assert h["v4_loads"] >= 9 and h["v4_stores"]
    if "_depthwise_rows" in name:  # (RH + 2) rows x 3 shifts, each a 16-byte vector load (G = 144)
        rh = int(name.split("_intrawave_")[1].split("x")[0])
        assert h["v4_loads"] >= (rh + 2) * 3 + (9 if name.endswith("_wexp") else 0) and h["v4_stores"], h


def test_kernel_for_gives_fn_constexprs_grid():
    from ck_conv.backends.triton.aot import kernel_for
    from ck_conv.problem import ConvProblem
    p = ConvProblem(N=2, C=64, K=64, input_spatial=(9, 9), filter=(3, 3), pad_left=1, pad_right=1)
    fn, consts, grid = kernel_for(FWD, p)
    assert consts["BLOCK_M"] == 64 and consts["EVEN_C"] and consts["num_warps"] == 4
    assert grid(p) == ((2 * 81 + 63) // 64, 1, 1)
    fn_w, consts_w, grid_w = kernel_for(MORE[1].replace("filter1x1_pad0", "default") + "_sp4")
    assert consts_w["ATOMIC"] and consts_w["TABLE"] and not consts_w["WS"]
    # the split is the key's: an unsplit kernel stores directly
    assert not kernel_for(MORE[1].replace("filter1x1_pad0", "default"))[1]["ATOMIC"]
    gm_name, gm_p = [e for e in EXTENDED if "_gm8" in e[0]][0]
    fx, cx, gx = kernel_for(gm_name, ConvProblem(**gm_p))
    assert fx.__name__ == "conv_bwd_weight_gm_kernel" and cx["GM"] == 8 and cx["WS"] == 2 and cx["TABLE"] == 2
    assert not cx["ATOMIC"] and gx(ConvProblem(**gm_p)) == (9, 2, 2)
