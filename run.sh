#!/usr/bin/env bash
# ck-dispatcher: install everything into ./.venv (first run) and run the main job:
# a dispatched, validated GEMM and FMHA (numpy backend on the CPU; triton on a GPU).
# Re-install with CK_REINSTALL=1. Extra arguments go to `ck demo`.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/ck ] || [ "${CK_REINSTALL:-0}" = 1 ]; then
  echo "== installing into .venv (once) ==" >&2
  [ -d .venv ] || "$PY" -m venv .venv
  pkgs=(-e .)
  for d in plugins/gemm plugins/conv plugins/fmha archs/*/; do
    if [ -f "$d/pyproject.toml" ]; then pkgs+=(-e "$d"); fi
  done
  # numpy<2.3: the Triton 3.6 interpreter breaks with numpy>=2.4; torch 2.13.0 is the CPU build here.
  # ray and matplotlib: the optional extras ck-core[ray] and ck-core[plot] of `ck sweep` (tested in CI);
  # transformers: optional, for plugins/fmha/tests/test_transformers.py (attn_implementation="ck_fmha").
  .venv/bin/pip install -q --disable-pip-version-check "setuptools>=64" \
      "numpy<2.3" pluggy attrs tqdm pytest "triton==3.6.0" "torch==2.13.0" "ray==2.60.0" matplotlib \
      "transformers>=5,<6"
  .venv/bin/pip install -q --disable-pip-version-check --no-build-isolation --no-deps "${pkgs[@]}"
fi
exec .venv/bin/ck demo "$@"
