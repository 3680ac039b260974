"""Probe a few Triton GEMM configs per shape exactly as `ck bench gemm` times them
(CUDA-graph replays, same inputs, vs torch.matmul) and print the best.

    PYTHONPATH=plugins/gemm:. python benchmarks/gemm_probe.py --out $OUT/probe.json
"""
import argparse
import json

SHAPES = {
    (16, 4096, 4096): ["tri_plain_m16n64k256_g1_w4_s3_sk1", "tri_plain_m16n32k256_g1_w4_s3_sk1",
                       "tri_plain_m16n32k128_g1_w4_s4_sk1", "tri_plain_m16n64k128_g1_w4_s4_sk2",
                       "tri_plain_m16n64k256_g1_w4_s3_sk2", "tri_plain_m16n128k128_g1_w4_s4_sk4",
                       "tri_plain_m16n32k256_g1_w2_s4_sk1", "tri_plain_m16n64k128_g1_w4_s4_sk4"],
    (4096, 4096, 4096): ["tri_tma_persistent_m128n256k64_g8_w8_s3_sk1", "tri_tma_persistent_m128n256k64_g8_w8_s4_sk1",
                         "tri_tma_persistent_m128n256k64_g16_w8_s3_sk1", "tri_tma_m128n256k64_g8_w8_s3_sk1",
                         "tri_persistent_m128n256k64_g8_w8_s3_sk1", "tri_tma_persistent_m256n128k64_g8_w8_s3_sk1"],
    (1024, 1024, 1024): ["tri_tma_m64n128k128_g8_w4_s3_sk1", "tri_tma_m128n128k64_g8_w4_s4_sk1",
                         "tri_tma_m64n128k64_g8_w4_s4_sk1", "tri_tma_m64n64k128_g8_w4_s3_sk1",
                         "tri_plain_m64n128k64_g8_w4_s4_sk1"],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="probe.json")
    args = ap.parse_args()
    import torch
    from triton.testing import do_bench_cudagraph

    from ck_gemm.triton import GemmConfig, gemm

    rows = []
    for (m, n, k), names in SHAPES.items():
        for dt in (torch.bfloat16, torch.float16):
            a = torch.randn(m, k, device="cuda", dtype=dt)
            b = torch.randn(n, k, device="cuda", dtype=dt)
            c = torch.empty(m, n, device="cuda", dtype=dt)
            ref = torch.matmul(a, b.t())
            peer = do_bench_cudagraph(lambda: torch.matmul(a, b.t()), rep=200, return_mode="median")
            for name in names:
                cfg = GemmConfig.from_name(name)
                try:
                    gemm(a, b, layout="rcr", config=cfg, c=c)
                    err = ((c.float() - ref.float()).norm() / ref.float().norm()).item()
                    t = do_bench_cudagraph(lambda: gemm(a, b, layout="rcr", config=cfg, c=c), rep=200,
                                           return_mode="median")
                except Exception as e:  # noqa: BLE001 - one failing config never sinks the probe
                    print(f"{m}x{n}x{k} {dt} {name}: {type(e).__name__} {e}"[:200], flush=True)
                    continue
                row = {"M": m, "N": n, "K": k, "dtype": str(dt).split(".")[-1], "config": name,
                       "ratio": peer / t, "tflops": 2 * m * n * k / t / 1e9, "rel_err": err}
                rows.append(row)
                print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
