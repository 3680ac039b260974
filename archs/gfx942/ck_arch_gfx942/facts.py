"""Hardware and kernel-space facts of gfx942, AMD Instinct MI300X (CDNA3), as one data table.

Sources, composable_kernel (github.com/ROCm/composable_kernel):

* ``dispatcher/codegen/arch_specs.json``: family, warp size, LDS capacity,
  ``warp_configs`` (-> ``wave_layouts``), ``warp_tile_combos`` (the MFMA tiles
  per A_B_Acc dtype -> ``warp_tiles``), ``pipeline_lds_budget``;
* ``tile_engine/ops/gemm/gemm_validation_utils.py``: the GEMM pipelines
  (``GEMM_PIPELINES`` = mem, compv3, compv4), ``LDS_SIZE_MAP``, and the rules
  in :mod:`ck_gemm.ck_rules` (the GEMM plugin);
* ``dispatcher/codegen/fmha/fmha_arch_specs.json``: ``extras["fmha"]``;
* AMD data sheets: compute units and ``peak`` (MI300X data sheet (dense, no sparsity), HBM3 5.3 TB/s).

``pipeline_lds_limit``: the GEMM plugin counts every LDS buffer a pipeline
allocates (compv4 double-buffers), so each pipeline may fill the whole LDS.
CK states the same bound per buffer (``compv4``: half the capacity).
"""

FACTS = {
    "name": "gfx942",
    "family": "cdna3",
    "description": "AMD Instinct MI300X (CDNA3)",
    "warp_size": 64,
    "lds_bytes": 65536,  # 64 KiB
    "compute_units": 304,
    "dtypes": ("fp16", "bf16", "fp32", "fp8", "bf8", "int8"),
    # (M, N, K) of one wave's MFMA instruction tile, per A/B dtype
    "warp_tiles": {
        "fp16": ((32, 32, 8), (16, 16, 16), (32, 32, 16), (16, 16, 32), (4, 64, 16), (64, 4, 16)),
        "bf16": ((32, 32, 8), (16, 16, 16), (32, 32, 16), (16, 16, 32), (4, 64, 16), (64, 4, 16)),
        "fp32": ((16, 16, 4), (16, 16, 8), (16, 16, 16), (32, 32, 4), (32, 32, 8)),
        "fp8": ((32, 32, 16), (32, 32, 32), (16, 16, 32), (16, 16, 64)),
        "bf8": ((32, 32, 16), (32, 32, 32), (16, 16, 32), (16, 16, 64)),
        "int8": ((32, 32, 16), (16, 16, 32)),
    },
    "wave_layouts": ((1, 1, 1), (1, 2, 1), (1, 4, 1), (2, 1, 1), (2, 1, 2), (2, 2, 1), (4, 1, 1)),
    "pipelines": ("mem", "compv3", "compv4"),
    "pipeline_lds_limit": {"mem": 65536, "compv3": 65536, "compv4": 65536},
    "triton_target": ("hip", "gfx942", 64),
    # dense peaks; TFLOPS / TOPS, memory in GB/s
    "peak": {"fp16_tflops": 1307.4, "bf16_tflops": 1307.4, "fp8_tflops": 2614.9, "int8_tops": 2614.9, "fp32_tflops": 163.4, "tf32_tflops": 653.7, "mem_gbs": 5300.0},
    "extras": {
        "fmha": {
            # CK 01_fmha codegen (example/ck_tile/01_fmha/codegen): the pipelines it instantiates here and
            # the kernel-component factory (the kernel-name suffix) each family uses; a family
            # missing from "factories" has no CK kernels on this arch
            "ck_codegen": {
                "pipelines": ("qr", "qr_async", "qr_pagedkv", "appendkv"),
                "factories": {"fwd": "gfx9", "bwd_dot_do_o": "gfx9", "bwd_dq_dk_dv": "gfx9", "bwd_convert_dq": "gfx9", "fwd_splitkv": "gfx9", "fwd_splitkv_combine": "gfx9", "fwd_pagedkv": "gfx9", "fwd_appendkv": "gfx9", "batch_prefill": "gfx9"},
            },
            "arch_tag": "ck_tile::gfx9_t",
            "factory": "gfx9",  # CK's kernel-component factory (name suffix)
            "dtypes": ("fp16", "bf16", "fp32", "fp8", "fp8fp16", "fp8bf16", "fp8fp32", "bf8"),
            "pipelines": ("qr", "qr_async", "qs", "qr_pagedkv", "qr_nwarp_sshuffle", "appendkv", "bwd"),
            "supports_trload": False,
            "supports_v3": False,
            "lds_limits": {"qr": 65536, "qs": 65536},
            # (hdim_q, hdim_v) pairs CK's FMHA builds, per dtype
            "hdims": {
                "fp16": ((32, 32), (64, 64), (80, 96), (96, 128), (128, 128), (160, 160), (192, 128), (192, 192), (256, 256)),
                "bf16": ((32, 32), (64, 64), (80, 96), (96, 128), (128, 128), (160, 160), (192, 128), (192, 192), (256, 256)),
                "fp32": ((32, 32), (48, 48), (64, 64), (96, 128), (128, 128), (192, 192), (256, 256)),
                "fp8": ((64, 64), (128, 128), (192, 128), (256, 256)),
                "fp8bf16": ((64, 64), (128, 128), (192, 128), (256, 256)),
                "fp8fp32": ((128, 128),),
                "bf8": ((64, 64), (128, 128), (192, 128), (256, 256)),
            },
        },
    },
}
