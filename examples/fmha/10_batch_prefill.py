"""10 -- batch prefill: varlen queries (group mode) over paged KV, vLLM and SGLang page tables.

    python examples/fmha/10_batch_prefill.py [--backend numpy|triton]
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _common as ex  # noqa: E402
import _fmha  # noqa: E402

args, disp = _fmha.setup(__doc__)
B = _fmha.sizes(args, dict(batch=2, nhead_q=4, nhead_k=4, hdim_q=128, seqstart_q=(0, 5, 12), seqlens_k=(33, 17)),
                dict(batch=4, nhead_q=32, nhead_k=8, hdim_q=128, seqstart_q=(0, 512, 1024, 1536, 2048),
                     seqlens_k=(2048, 1024, 4096, 512)))
ok = True
for layout, lookup in (("linear", "vllm"), ("vectorized", "sglang"), ("linear", "sglang")):
    ok &= _fmha.run(disp, args, f"prefill {layout} pages, {lookup} table", family="batch_prefill", mode="group",
                    paged_kv=True, page_size=16, kv_layout=layout, kv_lookup=lookup, dtype="fp16", **B)
ex.finish(ok)
