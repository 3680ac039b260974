"""Hardware and kernel-space facts of sm90 (NVIDIA H100 SXM5), as one data table.

Sources: NVIDIA H100 Tensor Core GPU data sheet and Hopper tuning guide (132
SMs, 227 KB = 232448 B of shared memory per block, 255 registers per thread;
dense peaks), PTX ISA (``mma.sync`` and ``wgmma.mma_async`` shapes), and
Triton 3.6 (``mmaVersionToInstrShape`` / ``warpsPerTileV3``: how it lays
wgmma out over a block, which :mod:`.rules` mirrors).

Warp tiles are (M, N, K) per *warp*, the unit the GEMM plugin's tile rules
use (``tile_m % (warp_m * warp_tile_m) == 0`` ...):

* ``mma.sync`` m16n8kK is one warp's instruction: (16, 8, K);
* ``wgmma.mma_async`` m64nNkK runs on a warpgroup of four warps, each owning
  16 of its 64 rows: one warp's share is (16, N, K) -- Triton writes the same
  ``instrShape``.  K is 256 bits of the input type (16 fp16/bf16, 8 tf32,
  32 fp8/int8); N spans 8..256 (int8: at most 224), listed here as the powers
  of two that power-of-two tiles use.
"""

WGMMA_N = (16, 32, 64, 128, 256)
WGMMA_N_INT8 = (16, 32, 64, 128)

#: one warp's mma.sync tile per dtype (the rules tell it from wgmma tiles by N == 8)
MMA_SYNC = {
    "fp16": (16, 8, 16),
    "bf16": (16, 8, 16),
    "fp32": (16, 8, 8),   # tf32
    "fp8": (16, 8, 32),   # e4m3
    "bf8": (16, 8, 32),   # e5m2
    "int8": (16, 8, 32),
}
#: wgmma K per dtype (256 bits of input)
WGMMA_K = {"fp16": 16, "bf16": 16, "fp32": 8, "fp8": 32, "bf8": 32, "int8": 32}

SMEM_PER_BLOCK = 232448  # 227 KB opt-in maximum per block (228 KB per SM, 1 KB reserved)

FACTS = {
    "name": "sm90",
    "family": "hopper",
    "description": "NVIDIA H100 SXM5 (Hopper, sm_90)",
    "warp_size": 32,
    "lds_bytes": SMEM_PER_BLOCK,
    "compute_units": 132,
    "dtypes": ("fp16", "bf16", "fp32", "fp8", "bf8", "int8"),
    "warp_tiles": {
        dt: (MMA_SYNC[dt],) + tuple((16, n, WGMMA_K[dt]) for n in (WGMMA_N_INT8 if dt == "int8" else WGMMA_N))
        for dt in MMA_SYNC
    },
    # 4 warps (one warpgroup) and 8 warps (two); which of them wgmma can use is a rule
    "wave_layouts": ((4, 1, 1), (2, 2, 1), (1, 4, 1), (8, 1, 1), (4, 2, 1), (2, 4, 1)),
    # one software-pipelined main loop; its depth is the key's ``stages`` and the
    # copy engine (cp.async, TMA, warp-specialised TMA) its ``variant``
    "pipelines": ("multistage",),
    "pipeline_lds_limit": {"multistage": SMEM_PER_BLOCK},
    "triton_target": ("cuda", 90, 32),
    # dense peaks; TFLOPS / TOPS, memory in GB/s
    "peak": {"fp16_tflops": 989.4, "bf16_tflops": 989.4, "tf32_tflops": 494.7, "fp8_tflops": 1978.9,
             "int8_tops": 1978.9, "fp64_tflops": 66.9, "mem_gbs": 3350.0},
    "extras": {
        # the GEMM kernel space on Hopper (what ck_gemm.space.enumerate_keys reads)
        "gemm": {
            "pipelines": ("multistage",),
            "stages": (3, 4),
            "tiles_mn": (64, 128, 256),
            "tile_k_bytes": (128,),  # BLOCK_K 64 for 16-bit inputs, 128 for 8-bit, 32 for tf32
            # "tma_ws" too once the GEMM name grammar can spell it (its "_" splits the token).
            # Not "tma_streamk" / "streamk" yet: on the H100 (2026-11-27 probe) they ran 0.1-0.8x
            # cuBLAS where the data-parallel keys ran 0.6-1.15x (their fix-up held three C tiles
            # in registers), and the ranker, which has never seen them, picked them; with them,
            # the "streamk" entry below says on which tiles they are enumerated
            "variants": ("tile", "tma", "persistent"),
            "schedulers": ("intrawave",),
            "epilogues": ("cshuffle",),
            "pads": ((True, True, True),),  # Triton masks every edge
            # split-K keys: for skinny/mid M with long K (too few C tiles to fill 132 SMs); on
            # the small wgmma tiles, whose extra CTAs a large K loop can feed
            "split_k": {"factors": (2, 4), "variants": ("tile", "tma"), "max_tile_mn": 64 * 128},
            # stream-K keys: on the wgmma tiles that stream B fastest (skinny M) and the large
            # ones whose tile counts quantise worst (mid M: 5 x 16 tiles of 128x256 on 132 SMs)
            "streamk": {"tiles_mn": ((64, 64), (64, 128), (64, 256), (128, 128), (128, 256))},
        },
        # the cache between the SMs and HBM (H100 SXM5: 50 MB): what a skinny GEMM's re-read
        # weight matrix either hits or streams from HBM again
        "memory": {"l2_bytes": 50 * 1024 * 1024},
        "nvidia": {
            "sm": 90,
            "max_registers_per_thread": 255,
            "smem_per_sm": 233472,
            "max_threads_per_block": 1024,
            "max_cluster_size": 8,
            "tma": True,
            "wgmma": True,
        },
    },
}
