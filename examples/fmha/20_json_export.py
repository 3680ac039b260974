"""20 -- JSON export: a registry of forward kernels to JSON and back (names identical), the imported
registry dispatching a problem, and a problem itself round-tripping through JSON.

    python examples/fmha/20_json_export.py [--backend numpy|triton] [-o FILE]
(The CK dispatcher's python/06_json_export.py.)
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

import json  # noqa: E402
import tempfile  # noqa: E402

from ck_core import Dispatcher, Registry  # noqa: E402
from ck_fmha.problem import FmhaProblem  # noqa: E402

args, disp = _fmha.setup(__doc__, lambda p: p.add_argument("-o", "--output", default=None))
reg = disp.registry.filter(lambda f: f["family"] == "fwd" and f["hdim_q"] == 128 and f["dtype"] == "fp16")
out = Path(args.output) if args.output else Path(tempfile.mkdtemp()) / f"fmha_{args.arch}.json"
reg.export_json(out)
data = json.loads(out.read_text())
print(f"wrote {out}: format {data['format']}, arch {data['arch']}, {len(data['kernels'])} kernels")
print(json.dumps(data["kernels"][0], indent=1)[:500])
back = Registry.import_json(out)
same = [k.name for k in back] == [k.name for k in reg]
print(f"round trip: {len(back)} kernels, names identical: {same}")
p = FmhaProblem(**_fmha.sizes(args, dict(batch=2, nhead_q=4, seqlen_q=30, seqlen_k=30),
                              dict(batch=4, nhead_q=16, seqlen_q=1024, seqlen_k=1024)), hdim_q=128, mask="t")
p_back = FmhaProblem(**json.loads(json.dumps(p.to_dict())))
print(f"problem round trip equal: {p_back == p}")
ok = ex.check(Dispatcher(back, backend=args.backend), p_back, args.rng, label="imported registry")
ex.finish(ok and same and p_back == p and len(reg) > 0)
