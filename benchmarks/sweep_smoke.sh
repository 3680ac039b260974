#!/bin/bash
# One call on the GPU machine: the smoke category of every op through `ck sweep` (local
# executor, and Ray where it is installed), then compile throughput against workers.
#   bash benchmarks/sweep_smoke.sh          (results packed into $OUT/sweeps.tgz, log in $OUT/log.txt)
# Each step has its own time limit (SIGINT: the sweep writes its JSON with "interrupted": true).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/ck_out}; mkdir -p "$OUT"
R=/tmp/sweeps; rm -rf "$R"; mkdir -p "$R"
exec > >(tee -a "$OUT/log.txt") 2>&1
A=""; for d in archs/*/; do A="$A -e $d"; done
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . -e plugins/gemm -e plugins/fmha \
    -e plugins/conv $A > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
EXECS="local"
if python3 -c "import ray" 2>/dev/null; then EXECS="local ray"; else echo "ray is not installed here: local executor only"; fi
CONV_F="(c.specialization in ('default', 'filter1x1_pad0') and c.pipeline == 'compv3' and c.tile_k == 64 and (c.tile_m, c.tile_n) in ((64, 64), (128, 128)) and c.warp_tile_n == 16 and c.warp_m == 2 and c.warp_n == 2) or (c.specialization == 'depthwise' and c.ndim == 2)"
GEMM_F="c.variant in ('tile', 'tma_persistent_cs')"
sweep() {  # sweep EXECUTOR LIMIT_S OP ARGS...
    local ex=$1 lim=$2 op=$3; shift 3
    echo "=== $op $ex $(date -u +%H:%M:%S)"
    CK_CACHE_DIR=/tmp/ckcache_$ex TRITON_CACHE_DIR=/tmp/tcache_$ex timeout -s INT "$lim" python3 -m ck_core sweep "$op" --arch sm90 --backend triton \
        --category smoke --verify --workers 16 --f64-flops 1e10 --no-progress --executor "$ex" \
        --csv "$R/${op}_smoke_$ex.csv" --json "$R/${op}_smoke_$ex.json" --plot "$R/${op}_smoke_$ex" "$@"
    echo "rc=$? $(date -u +%H:%M:%S)"
}
for ex in $EXECS; do
    sweep "$ex" 70 fmha --dtypes fp16,bf16 --variant fwd
    sweep "$ex" 130 gemm --dtypes fp16,bf16 --layouts rcr --filter "$GEMM_F"
    sweep "$ex" 80 conv --dtypes fp16,bf16 --filter "$CONV_F"
done
echo "=== compile throughput vs workers $(date -u +%H:%M:%S)"
for w in 1 4 16; do
    CK_CACHE_DIR=/tmp/ckscale_$w TRITON_CACHE_DIR=/tmp/tscale_$w timeout -s INT 45 python3 -m ck_core sweep gemm \
        --arch sm90 --backend triton --dtypes fp16 --layouts rcr --max-kernels 12 --compile-only --workers $w \
        --no-progress --json "$R/compile_scaling_w$w.json"
done
tar czf "$OUT/sweeps.tgz" -C "$R" .
ls -la "$R"
