"""Grouped convolution vs cuDNN; the suite lives in ck_conv.bench (`ck bench conv --vs torch`).

    PYTHONPATH=plugins/conv:. python benchmarks/conv_bench.py --json $OUT/conv_raw.json
"""
import sys

from ck_conv.bench import main

if __name__ == "__main__":
    sys.exit(main())
