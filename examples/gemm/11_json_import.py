"""11 -- JSON import: kernels from a registry file (yours, or one written here), dispatched and validated.

    python examples/gemm/11_json_import.py [--backend numpy|triton] [--file registry.json]
The same as `ck import FILE`; the file's arch must match --arch's backend kernels.
"""
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common as ex  # noqa: E402

from ck_core import Dispatcher, Registry  # noqa: E402
from ck_gemm import GemmProblem  # noqa: E402

args = ex.parse_args(__doc__, lambda p: p.add_argument("--file", default=None))
if args.file:
    path = Path(args.file)
else:  # stand-in for an external configuration file: a small exported registry
    path = Path(tempfile.mkdtemp()) / "kernels.json"
    src = Registry.from_enumeration("gemm", args.arch, args.backend, dtypes=["fp16", "bf16"], layouts=["rcr"])
    src.filter("c.tile_m == 128 and c.pad_m and c.pad_n and c.pad_k").export_json(path)
reg = Registry.import_json(path)
print(f"imported {path}: registry {reg.name!r}, arch {reg.arch}, {len(reg)} kernels")
args.arch = reg.arch
disp = Dispatcher(reg, backend=args.backend)
ok = True
for dt in sorted({k.signature.dtype for k in reg}):
    p = GemmProblem(m=150, n=70, k=90, dtype=dt, layout="rcr")
    ok &= ex.check(disp, p, args.rng, label=f"{dt} 150x70x90")
ex.finish(ok)
