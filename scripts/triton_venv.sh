#!/usr/bin/env bash
# Build the virtualenv that runs Triton (through PyTriton) for benchmarks/vs_triton.py.
# PyTriton is not a dependency of wattserve: it lives in its own venv, with the same torch and
# torchvision the project pins, so both servers run the same model code.
#   scripts/triton_venv.sh [VENV]          (default /work/.venv-triton)
# Then: python -m benchmarks.vs_triton --triton-python VENV/bin/python
set -euo pipefail
VENV="${1:-/work/.venv-triton}"
python3 -m venv "$VENV"
"$VENV/bin/pip" install torch==2.14.1 torchvision==0.29.1 nvidia-pytriton==0.7.0 numpy
# Triton's Python backend stub needs the interpreter's own lib directory on LD_LIBRARY_PATH
# (else it fails on an RLock error); the benchmark sets it from this value.
LIBDIR="$("$VENV/bin/python" -c 'import sys; print(sys.base_prefix)')/lib"
"$VENV/bin/python" -c 'import pytriton, torch, torchvision; print("pytriton ok; torch", torch.__version__, "torchvision", torchvision.__version__)'
echo "run Triton scripts with LD_LIBRARY_PATH=$LIBDIR"
