"""Hardware and kernel-space facts of gfx90a, AMD Instinct MI250X, one GCD (CDNA2), as one data table.

Sources, composable_kernel (github.com/ROCm/composable_kernel):

* ``dispatcher/codegen/arch_specs.json``: family, warp size, LDS capacity,
  ``warp_configs`` (-> ``wave_layouts``), ``warp_tile_combos`` (the MFMA tiles
  per A_B_Acc dtype -> ``warp_tiles``), ``pipeline_lds_budget``;
* ``tile_engine/ops/gemm/gemm_validation_utils.py``: the GEMM pipelines
  (``GEMM_PIPELINES`` = mem, compv3, compv4), ``LDS_SIZE_MAP``, and the rules
  in :mod:`ck_gemm.ck_rules` (the GEMM plugin);
* ``dispatcher/codegen/fmha/fmha_arch_specs.json``: ``extras["fmha"]``;
* AMD data sheets: compute units and ``peak`` (MI250X: 383 TFLOPS fp16/bf16/int8, 95.7 TFLOPS fp32 matrix, 3.2768 TB/s HBM2e over 2 GCDs).

CK's arch_specs.json also lists fp8/bf8 warp tiles for gfx90a; CDNA2 has no fp8
MFMA (CK emulates it through fp32), so this plugin leaves fp8/bf8 out of ``dtypes``.

``pipeline_lds_limit``: the GEMM plugin counts every LDS buffer a pipeline
allocates (compv4 double-buffers), so each pipeline may fill the whole LDS.
CK states the same bound per buffer (``compv4``: half the capacity).
"""

FACTS = {
    "name": "gfx90a",
    "family": "cdna2",
    "description": "AMD Instinct MI250X, one GCD (CDNA2)",
    "warp_size": 64,
    "lds_bytes": 65536,  # 64 KiB
    "compute_units": 110,
    "dtypes": ("fp16", "bf16", "fp32", "int8"),
    # (M, N, K) of one wave's MFMA instruction tile, per A/B dtype
    "warp_tiles": {
        "fp16": ((32, 32, 8), (16, 16, 16), (32, 32, 16), (16, 16, 32), (4, 64, 16), (64, 4, 16)),
        "bf16": ((32, 32, 8), (16, 16, 16), (32, 32, 16), (16, 16, 32), (4, 64, 16), (64, 4, 16)),
        "fp32": ((16, 16, 4), (16, 16, 8), (16, 16, 16), (32, 32, 4), (32, 32, 8)),
        "int8": ((32, 32, 16), (16, 16, 32)),
    },
    "wave_layouts": ((1, 4, 1), (2, 2, 1), (4, 1, 1)),
    "pipelines": ("mem", "compv3", "compv4"),
    "pipeline_lds_limit": {"mem": 65536, "compv3": 65536, "compv4": 65536},
    "triton_target": ("hip", "gfx90a", 64),
    # dense peaks; TFLOPS / TOPS, memory in GB/s
    "peak": {"fp16_tflops": 191.5, "bf16_tflops": 191.5, "fp32_tflops": 47.9, "int8_tops": 191.5, "mem_gbs": 1638.4},
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
            "dtypes": ("fp16", "bf16", "fp32"),
            "pipelines": ("qr", "qr_async", "qs", "qr_pagedkv", "qr_nwarp_sshuffle", "appendkv", "bwd"),
            "supports_trload": False,
            "supports_v3": False,
            "lds_limits": {"qr": 65536, "qs": 65536},
            # (hdim_q, hdim_v) pairs CK's FMHA builds, per dtype
            "hdims": {
                "fp16": ((32, 32), (64, 64), (80, 96), (96, 128), (128, 128), (160, 160), (192, 128), (192, 192), (256, 256)),
                "bf16": ((32, 32), (64, 64), (80, 96), (96, 128), (128, 128), (160, 160), (192, 128), (192, 192), (256, 256)),
                "fp32": ((32, 32), (48, 48), (64, 64), (96, 128), (128, 128), (192, 192), (256, 256)),
            },
        },
    },
}
