"""Hardware and kernel-space facts of gfx1201, AMD Radeon RX 9070 XT (RDNA4), as one data table.

Sources, composable_kernel (github.com/ROCm/composable_kernel):

* ``dispatcher/codegen/arch_specs.json``: family, warp size, LDS capacity,
  ``warp_configs`` (-> ``wave_layouts``), ``warp_tile_combos`` (the WMMA tiles
  per A_B_Acc dtype -> ``warp_tiles``), ``pipeline_lds_budget``;
* ``tile_engine/ops/gemm/gemm_validation_utils.py``: the GEMM pipelines
  (``GEMM_PIPELINES`` = mem, compv3, compv4), ``LDS_SIZE_MAP``, and the rules
  in :mod:`ck_gemm.ck_rules` (the GEMM plugin);
* ``dispatcher/codegen/fmha/fmha_arch_specs.json``: ``extras["fmha"]``;
* AMD data sheets: compute units and ``peak`` (RX 9070 XT (64 CUs, 2.97 GHz boost, WMMA; dense), 20.1 Gbps GDDR6 x 256 bit).

No fp32 entry: RDNA has no fp32 WMMA (CK tile engine ``op_warp_tile_allowed``
rejects fp32 on gfx1201 for that reason).

``pipeline_lds_limit``: the GEMM plugin counts every LDS buffer a pipeline
allocates (compv4 double-buffers), so each pipeline may fill the whole LDS.
CK states the same bound per buffer (``compv4``: half the capacity).
"""

FACTS = {
    "name": "gfx1201",
    "family": "rdna4",
    "description": "AMD Radeon RX 9070 XT (RDNA4)",
    "warp_size": 32,
    "lds_bytes": 65536,  # 64 KiB
    "compute_units": 64,
    "dtypes": ("fp16", "bf16", "fp8", "bf8", "int8"),
    # (M, N, K) of one wave's WMMA instruction tile, per A/B dtype
    "warp_tiles": {
        "fp16": ((16, 16, 16),),
        "bf16": ((16, 16, 16),),
        "fp8": ((16, 16, 16),),
        "bf8": ((16, 16, 16),),
        "int8": ((16, 16, 16),),
    },
    "wave_layouts": ((2, 4, 1), (1, 8, 1), (8, 1, 1), (4, 2, 1)),
    "pipelines": ("mem", "compv3", "compv4"),
    "pipeline_lds_limit": {"mem": 65536, "compv3": 65536, "compv4": 65536},
    "triton_target": ("hip", "gfx1201", 32),
    # dense peaks; TFLOPS / TOPS, memory in GB/s
    "peak": {"fp16_tflops": 194.7, "bf16_tflops": 194.7, "fp8_tflops": 389.3, "int8_tops": 389.3, "mem_gbs": 644.6},
    "extras": {
        # CK tile engine's gfx120x_config.json sweeps tile_k over 64..256 elements on
        # RDNA (wave32 WMMA): start the K tile at 128 bytes instead of the GEMM default 64
        "gemm": {"tile_k_bytes": (128, 256)},
        "fmha": {
            # CK 01_fmha codegen (example/ck_tile/01_fmha/codegen): the pipelines it instantiates here and
            # the kernel-component factory (the kernel-name suffix) each family uses; a family
            # missing from "factories" has no CK kernels on this arch
            "ck_codegen": {
                "pipelines": ("qr", "qr_nwarp_sshuffle", "qr_pagedkv", "appendkv"),
                "factories": {"fwd": "gfx12", "bwd_dot_do_o": "gfx12", "bwd_dq_dk_dv": "gfx12", "bwd_convert_dq": "gfx12", "fwd_splitkv": "gfx12", "fwd_splitkv_combine": "gfx12", "fwd_pagedkv": "gfx12", "fwd_appendkv": "gfx12"},
            },
            "arch_tag": "ck_tile::gfx12_t",
            "factory": "gfx12",  # CK's kernel-component factory (name suffix)
            "dtypes": ("fp16", "bf16", "fp8", "fp8bf16"),
            "pipelines": ("qr", "qr_pagedkv", "qr_nwarp_sshuffle", "appendkv", "bwd"),
            "supports_trload": False,
            "supports_v3": False,
            "lds_limits": {"qr": 65536, "qs": 65536},
            # (hdim_q, hdim_v) pairs CK's FMHA builds, per dtype
            "hdims": {
                "fp16": ((32, 32), (64, 64), (80, 96), (96, 128), (128, 128), (160, 160), (192, 128), (192, 192), (256, 256)),
                "bf16": ((32, 32), (64, 64), (80, 96), (96, 128), (128, 128), (160, 160), (192, 128), (192, 192), (256, 256)),
                "fp8": ((64, 64), (128, 128), (192, 128), (256, 256)),
                "fp8bf16": ((64, 64), (128, 128), (192, 128), (256, 256)),
            },
        },
    },
}
