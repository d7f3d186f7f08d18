#!/usr/bin/env bash
# Install Triton's perf_analyzer (the binary shipped in the tritonclient wheel) in a venv of its
# own, outside the tree, and write a wrapper that runs it with the CUDA runtime it links against.
# perf_analyzer is not a wattserve dependency: it is the tool Triton users benchmark with, so CI
# runs it against wattserve (tests/conformance/test_perf_analyzer.py).
#   scripts/install_perf_analyzer.sh [VENV]
#     VENV: default $WATTSERVE_PA_VENV, else /tmp/wattserve-pa-venv
# Prints the wrapper's path on its last line; export it as WATTSERVE_PERF_ANALYZER.
# Idempotent: a second run with everything in place installs nothing.
#
# Why 2.51.0: it is the newest release whose perf_analyzer binary runs on Debian 12's glibc 2.36
# (later ones need a newer glibc). The binary links libcudart (from nvidia-cuda-runtime-cu12,
# which loads without a GPU) and libb64 (Debian's libb64-0d).
set -euo pipefail
VENV="${1:-${WATTSERVE_PA_VENV:-/tmp/wattserve-pa-venv}}"
PA_VERSION="${WATTSERVE_PA_VERSION:-2.51.0}"
WRAPPER="$VENV/bin/perf_analyzer-wattserve"

if ! ldconfig -p 2>/dev/null | grep -q 'libb64\.so\.0d'; then
  export DEBIAN_FRONTEND=noninteractive
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -q >&2
  $SUDO apt-get install -y -q --no-install-recommends libb64-0d >&2
fi

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV" >&2
fi
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('tritonclient') != '$PA_VERSION')" 2>/dev/null \
  || ! "$VENV/bin/python" -c "import nvidia.cuda_runtime" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  "$VENV/bin/python" -m pip install -q "tritonclient[http]==$PA_VERSION" nvidia-cuda-runtime-cu12 >&2
fi

CUDART_LIB="$("$VENV/bin/python" -c 'import nvidia.cuda_runtime, os; print(os.path.join(list(nvidia.cuda_runtime.__path__)[0], "lib"))')"
cat >"$WRAPPER" <<EOF
#!/usr/bin/env bash
# Written by scripts/install_perf_analyzer.sh: perf_analyzer $PA_VERSION with its CUDA runtime.
export LD_LIBRARY_PATH="$CUDART_LIB\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$VENV/bin/perf_analyzer" "\$@"
EOF
chmod +x "$WRAPPER"

# A binary that cannot load its libraries fails here, not in the middle of a test.
if ! "$WRAPPER" --version >/dev/null 2>&1; then
  echo "perf_analyzer does not run; its own message:" >&2
  "$WRAPPER" --version >&2 || true
  exit 1
fi
echo "$WRAPPER"
