#!/usr/bin/env bash
# Test the wheel kit end to end on this machine, offline (pip --no-index), in fresh venvs:
#  A. Python 3.11 (this machine's): a kit built for 3.11; a fresh venv that sees only the
#     packages the GPU image has (scripts/gpu_image_packages.txt, linked from this venv: a
#     stand-in for the image); `pip install --no-index --find-links KIT wattserve`; then
#     `wattserve serve` (identity, then mobilenet_v2) must answer /v2/health/ready and an infer.
#  B. Python 3.12 (the device's), if python3.12 exists: the device kit (.whl/, built if absent)
#     installs with --no-index into a fresh 3.12 venv and the server packages import there.
# Usage: scripts/gpu_kit_selftest.sh   (PYTHON: the venv wattserve is installed in;
#        PARTS=A or PARTS=B runs one part; PY312: a Python 3.12 interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY="${PYTHON:-python3}"
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
BASE311=$("$PY" -c 'import sys; print(sys.base_prefix)')/bin/python3
TMP=$(mktemp -d)
SERVER_PID=
cleanup() { if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; fi; rm -rf "$TMP"; }
trap cleanup EXIT

PARTS="${PARTS:-AB}"
if [[ "$PARTS" == *A* ]]; then
echo "== A. kit for Python 3.11 -> fresh venv (image stand-in) -> wattserve serve"
"$PY" scripts/gpu_kit.py --python-version 3.11 --dest "$TMP/kit311" | tail -3
"$BASE311" -m venv "$TMP/venv"
SITE=$("$TMP/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$PY" - "$ROOT/scripts/gpu_image_packages.txt" "$TMP/image" <<'PYEOF'
"""Link the image's packages (and nothing else) from this venv into one folder."""
import importlib.metadata as md, re, sys
from pathlib import Path
canon = lambda n: re.sub(r"[-_.]+", "-", n).lower()
image = {canon(l.split("#")[0].strip()) for l in Path(sys.argv[1]).read_text().splitlines() if l.split("#")[0].strip()}
out = Path(sys.argv[2]); out.mkdir()
linked = 0
for dist in md.distributions():
    if canon(dist.metadata["Name"]) not in image:
        continue
    tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
    for top in tops:
        src = Path(dist.locate_file(top))
        if src.exists() and not (out / top).exists() and top != "__pycache__":
            (out / top).symlink_to(src)
    linked += 1
print(f"image stand-in: {linked} distributions linked")
PYEOF
echo "$TMP/image" >"$SITE/zz_gpu_image_stand_in.pth"
"$TMP/venv/bin/python" -c 'import fastapi' 2>/dev/null && { echo "fastapi already importable: not a fair test"; exit 1; }
"$TMP/venv/bin/python" -m pip install -q --no-index --no-cache-dir --find-links "$TMP/kit311" wattserve
echo "installed from the kit: $("$TMP/venv/bin/python" -m pip list 2>/dev/null | grep -Ei '^(wattserve|fastapi|uvicorn|pydantic) ' | tr -s ' ' | paste -sd, -)"

serve() {  # serve MODEL: start `wattserve serve` from the kit venv, outside the tree; infer once
  local model=$1 port elements body
  port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  (cd "$TMP" && exec env -u PYTHONPATH WATTSERVE_MODEL="$model" WATTSERVE_PORT="$port" WATTSERVE_LOG_LEVEL=warning \
     WATTSERVE_CACHE_DIR="$TMP/cache" "$TMP/venv/bin/wattserve" serve >"$TMP/serve-$model.log" 2>&1) &
  SERVER_PID=$!
  for _ in $(seq 1 300); do
    curl -fs "http://127.0.0.1:$port/v2/health/ready" >/dev/null 2>&1 && break
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$TMP/serve-$model.log"; exit 1; }
    sleep 1
  done
  curl -fs "http://127.0.0.1:$port/v2/health/ready" >/dev/null || { echo "$model: not ready"; cat "$TMP/serve-$model.log"; exit 1; }
  if [ "$model" = identity ]; then
    echo '{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"FP32","data":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]}]}' >"$TMP/body.json"
  else
    "$PY" -c 'import json; print(json.dumps({"inputs":[{"name":"input","shape":[1,3,224,224],"datatype":"FP32","data":[0.0]*(3*224*224)}]}))' >"$TMP/body.json"
  fi
  curl -fs -H 'Content-Type: application/json' --data-binary "@$TMP/body.json" "http://127.0.0.1:$port/v2/models/$model/infer" \
    | "$PY" -c 'import json,sys; d=json.load(sys.stdin); print("  infer ok:", d["model_name"], [(o["name"], o["shape"]) for o in d["outputs"]])'
  curl -fs "http://127.0.0.1:$port/metrics" | grep -E '^wattserve_gpu_telemetry_available' | sed 's/^/  /'
  (cd "$TMP" && env -u PYTHONPATH "$TMP/venv/bin/python" -c 'import wattserve.server as s; print("  served from", s.__path__[0])')
  kill -TERM "$SERVER_PID"; wait "$SERVER_PID" || true; SERVER_PID=
  echo "  wattserve serve ($model) from the kit: OK"
}
serve identity
serve mobilenet_v2
fi
[[ "$PARTS" == *B* ]] || exit 0

echo "== B. the device kit (Python 3.12) installs offline into a fresh 3.12 venv"
PY312="${PY312:-}"
for candidate in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do
  [ -n "$PY312" ] && break
  "$candidate" -V >/dev/null 2>&1 && PY312=$candidate
done
if [ -z "$PY312" ]; then echo "no Python 3.12 here: B skipped"; exit 0; fi
[ -f .whl/KIT.json ] || "$PY" scripts/gpu_kit.py --python-version 3.12 | tail -2
"$PY312" -m venv "$TMP/venv312"
# --no-deps: torch & co. are the image's; here only the kit's own wheels must install and import
"$TMP/venv312/bin/python" -m pip install -q --no-index --no-cache-dir --no-deps .whl/*.whl
(cd "$TMP" && env -u PYTHONPATH "$TMP/venv312/bin/python" -) <<'PYEOF'
# Only what needs nothing from the image: the compiled cp312 wheels, and the settings stack.
import hdrh, httptools, orjson, pydantic, pydantic_core, pydantic_settings, watchfiles, websockets
from wattserve.server.settings import Settings  # the kit's wattserve, not the tree
import wattserve.server
print(f"  3.12 kit imports: pydantic {pydantic.__version__} (core {pydantic_core.__version__}), orjson "
      f"{orjson.__version__}, httptools, websockets, watchfiles, hdrh; Settings().model={Settings().model}; "
      f"from {wattserve.server.__path__[0]}")
PYEOF
echo "gpu kit self-test: OK"
