"""``python -m ck_core.sweep ARGS``: the same as ``ck sweep ARGS``."""
import sys

from ..cli import main

sys.exit(main(["sweep", *sys.argv[1:]]))
