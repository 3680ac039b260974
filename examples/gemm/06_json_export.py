"""06 -- JSON export: write a registry to JSON, read it back, compare.

    python examples/gemm/06_json_export.py [--backend numpy|triton] [-o FILE]
"""
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common as ex  # noqa: E402

from ck_core import Registry  # noqa: E402

args = ex.parse_args(__doc__, lambda p: p.add_argument("-o", "--output", default=None))
reg = Registry.from_enumeration("gemm", args.arch, args.backend, dtypes=["fp16", "bf16"], layouts=["rcr"])
reg = reg.filter("c.tile_m == 128 and c.tile_n == 128")
out = Path(args.output) if args.output else Path(tempfile.mkdtemp()) / f"gemm_{args.arch}.json"
reg.export_json(out)
data = json.loads(out.read_text())
print(f"wrote {out}: format {data['format']}, arch {data['arch']}, {len(data['kernels'])} kernels")
print("first record:")
print(json.dumps(data["kernels"][0], indent=1)[:600])
back = Registry.import_json(out)
same = [k.name for k in back] == [k.name for k in reg]
print(f"round trip: {len(back)} kernels, names identical: {same}")
ex.finish(same and len(reg) > 0)
