"""FMHA Triton kernels vs torch SDPA (cuDNN and flash backends); the suite lives in
ck_fmha.bench (`ck bench fmha --vs sdpa`).

    PYTHONPATH=plugins/fmha:. python benchmarks/fmha_triton_bench.py --out $OUT/fmha_triton_raw.json
"""
import sys

from ck_fmha.bench import main

if __name__ == "__main__":
    sys.exit(main())
