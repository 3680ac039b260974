"""01 -- 2 (channels-last NHWGC, fp16), validated against a float64 reference.

    python examples/conv/01_conv2d_fwd.py [--backend numpy|triton]
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from _conv import main  # noqa: E402

main("forward", 2, __doc__)
