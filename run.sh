#!/usr/bin/env bash
# ck-dispatcher: install everything into ./.venv (first run) and run the main job:
# a dispatched, validated GEMM and FMHA (numpy backend on the CPU; triton on a GPU).
# Needs Python 3.10 to 3.13: triton 3.6.0 and torch 2.13.0 publish wheels for 3.10-3.14, and numpy<2.3
# (which Triton 3.6's interpreter needs) for 3.10-3.13. PYTHON=/path/to/python picks one, else the
# first of python3, python3.13 ... python3.10 that fits.
# A missing, broken or half-installed .venv is rebuilt; CK_REINSTALL=1 rebuilds it anyway.
# Extra arguments go to `ck demo`.
set -euo pipefail
cd "$(dirname "$0")"
MIN=3.10 MAX=3.13

fits() {  # does interpreter $1 run and have a version in [MIN, MAX]?
  "$1" -c "import sys; v = sys.version_info[:2]; sys.exit(not ((3, 10) <= v <= (3, 13)))" 2>/dev/null
}

# what the install depends on: a change (or a half-finished install) means install again
stamp() { cat run.sh pyproject.toml plugins/*/pyproject.toml archs/*/pyproject.toml 2>/dev/null | cksum; }

if [ "${CK_REINSTALL:-0}" = 1 ] || [ ! -x .venv/bin/ck ] || ! fits .venv/bin/python \
   || [ "$(cat .venv/.ck-installed 2>/dev/null)" != "$(stamp)" ]; then
  if [ -n "${PYTHON:-}" ]; then
    PY=$PYTHON
    if ! fits "$PY"; then
      echo "run.sh: PYTHON=$PY is $("$PY" -V 2>&1 || echo 'not runnable'); ck-dispatcher needs Python $MIN to $MAX" \
           "(the versions with wheels of triton 3.6.0, torch 2.13.0 and numpy<2.3)" >&2
      exit 4
    fi
  else
    PY=
    for c in python3 python3.13 python3.12 python3.11 python3.10; do
      if command -v "$c" >/dev/null && fits "$c"; then PY=$c; break; fi
    done
    if [ -z "$PY" ]; then
      echo "run.sh: no Python $MIN to $MAX found (python3 is $(python3 -V 2>&1 || echo missing));" \
           "install one (triton 3.6.0, torch 2.13.0 and numpy<2.3 have wheels for those only) and run" \
           "PYTHON=/path/to/python3.12 bash run.sh" >&2
      exit 4
    fi
  fi
  if [ "${CK_REINSTALL:-0}" = 1 ] || [ ! -f .venv/.ck-installed ] || ! fits .venv/bin/python; then
    rm -rf .venv   # broken, half-installed or asked for: start clean
  fi
  echo "== installing into .venv with $("$PY" -V 2>&1) (once) ==" >&2
  [ -d .venv ] || "$PY" -m venv .venv
  rm -f .venv/.ck-installed
  pkgs=(-e .)
  for d in plugins/gemm plugins/conv plugins/fmha archs/*/; do
    if [ -f "$d/pyproject.toml" ]; then pkgs+=(-e "$d"); fi
  done
  # The tested versions (the extras ck-core[triton,torch,ray,plot,progress,test] and
  # ck-fmha[transformers] accept ranges): numpy<2.3 because the Triton 3.6 interpreter breaks
  # with numpy>=2.4; torch 2.13.0 is the CPU build here; ray and matplotlib are `ck sweep`'s.
  .venv/bin/pip install -q --disable-pip-version-check "setuptools>=64" \
      "numpy<2.3" pluggy attrs tqdm pytest "triton==3.6.0" "torch==2.13.0" "ray==2.60.0" matplotlib \
      "transformers>=5,<6"
  .venv/bin/pip install -q --disable-pip-version-check --no-build-isolation --no-deps "${pkgs[@]}"
  stamp > .venv/.ck-installed   # written last: its absence marks an install that did not finish
fi
exec .venv/bin/ck demo "$@"
