#!/bin/bash
# One call on the GPU machine: install the packages, then run the named steps in order.
#   bash benchmarks/device_run.sh tests gemmprobe convprobe      (results under $OUT)
# Each step's output goes to $OUT/log.txt (and the tail to the console); a failing
# step never stops the ones after it.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/ck_out}; mkdir -p "$OUT"
A=""; for d in archs/*/; do A="$A -e $d"; done
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . -e plugins/gemm -e plugins/fmha \
    -e plugins/conv $A > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,clocks.max.sm,temperature.gpu --format=csv,noheader
for step in "$@"; do
    echo "=== $step $(date -u +%H:%M:%S)" | tee -a "$OUT/log.txt"
    case $step in
        tests) CK_TEST_GPU=1 timeout 420 python3 -m pytest -q -m "gpu or not gpu" -rfE -p no:warnings \
                   plugins/gemm/tests/test_gemm_gpu.py plugins/fmha/tests/test_dispatch_gpu.py plugins/fmha/tests/test_gluon_gpu.py ;;
        gemmprobe) timeout 300 python3 benchmarks/gemm_probe.py --out "$OUT/gemm_probe.json" ;;
        convprobe) timeout 300 python3 benchmarks/conv_probe.py --out "$OUT/conv_probe.json" ;;
        overhead) timeout 120 python3 -c "import json, logging; logging.basicConfig(level=logging.WARNING); \
logging.getLogger('ck_core.backends.triton_replay').setLevel(logging.DEBUG); from ck_core import Registry; from ck_gemm.bench import _overhead; \
reg = Registry.from_enumeration('gemm', 'sm90', 'triton', dtypes=['bf16'], layouts=['rcr']); \
print(json.dumps(_overhead(reg, 'bf16'), indent=1))" ;;
        bwdprobe) timeout 300 python3 benchmarks/fmha_bwd_probe.py --out "$OUT/bwd_probe.json" ;;
        fp8probe) timeout 200 python3 benchmarks/fmha_fp8_probe.py --out "$OUT/fp8_probe.json" ;;
        fmhatests) CK_TEST_GPU=1 timeout 300 python3 -m pytest -q -m "gpu or not gpu" -rfE -p no:warnings \
                   plugins/fmha/tests/test_dispatch_gpu.py plugins/fmha/tests/test_gluon_gpu.py ;;
        dwprobe) timeout 150 python3 benchmarks/conv_probe.py --cases depthwise_3x3_144_56 --directions forward \
                     --rows-only --budget 80 --compile-budget 50 --out "$OUT/conv_probe_rows.json" ;;
        gluonprobe) timeout 400 python3 benchmarks/gluon_fa_probe.py --out "$OUT/gluon_probe.json" ;;
        fusedprobe) timeout 500 python3 benchmarks/gluon_fa_probe.py --fused --out "$OUT/fused_probe.json" ;;
        fusedquick) timeout 300 python3 benchmarks/gluon_fa_probe.py --fused --quick --out "$OUT/fused_probe.json" ;;
        fp8debug) timeout 240 python3 benchmarks/fp8_layout_debug.py ;;
        gemmbench) timeout 400 ck bench gemm --vs torch --json "$OUT/gemm.json" ;;
        fmhabench) timeout 500 ck bench fmha --vs sdpa --json "$OUT/fmha.json" ;;
        convbench) timeout 400 ck bench conv --vs torch --json "$OUT/conv.json" ;;
        bigdprobe) timeout 150 python3 benchmarks/fmha_bigd_probe.py --out "$OUT/bigd_probe.json" ;;
        # the head-dim >128 and GQA backward cases first (issue 16's losses), then every category
        fmhabroad) timeout 540 python3 -m ck_fmha.bench_broad --budget 480 \
                       --cases 2,3,16,33,39,40,41,10,12,48,56,66,0,4 --out "$OUT/fmha_broad.json" ;;
        *) echo "unknown step $step" ;;
    esac 2>&1 | tee -a "$OUT/log.txt" | tail -n 25
done
echo "=== done $(date -u +%H:%M:%S)"
