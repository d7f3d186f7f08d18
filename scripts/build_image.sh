#!/usr/bin/env bash
# Build wattserve's container images without a Docker engine and without pulling from a
# registry: a Debian bookworm base made here with mmdebstrap (python3.11, venv, pip, as
# python:3.11-slim has them), imported as a local image, then `buildah bud` (vfs storage,
# chroot isolation) of Dockerfile.cpu, and of the CUDA Dockerfile on the same base.
#
#   scripts/build_image.sh [base|cpu|gpu|all]      default: cpu (builds the base if missing)
#
# Environment:
#   WATTSERVE_IMAGE_CPU   tag of the CPU image   (default localhost/wattserve:cpu)
#   WATTSERVE_IMAGE_GPU   tag of the CUDA Dockerfile's steps built on the Debian base
#                         (default localhost/wattserve:gpu-steps; NOT a GPU image, see Dockerfile)
#   WATTSERVE_BASE_IMAGE  tag of the local base  (default localhost/wattserve-base:bookworm)
#   WATTSERVE_REBUILD_BASE=1   make the base again even if it exists
#   WATTSERVE_TORCH_PACKAGES   torch requirement(s) for the CPU image (default: a CPU-only
#                         torch + torchvision pair on local disk if there is one, see below)
#
# pip inside the build reaches what pip on this machine reaches: the package registry plus
# the local indexes, wheel folders, constraints file and CA bundle this machine's pip
# configuration names (`pip config list`). They are mounted read-only into the build and
# handed to pip as PIP_EXTRA_INDEX_URL / PIP_FIND_LINKS / PIP_CONSTRAINT / PIP_CERT build
# args. apt inside the GPU build reaches Debian's mirrors (the base's sources.list).
# Needs root and: apt-get install -y mmdebstrap buildah (podman, runc for check_image.sh).
# Measured here: docs/deployment.md "Container images".
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET="${1:-cpu}"
BASE="${WATTSERVE_BASE_IMAGE:-localhost/wattserve-base:bookworm}"
CPU_TAG="${WATTSERVE_IMAGE_CPU:-localhost/wattserve:cpu}"
GPU_TAG="${WATTSERVE_IMAGE_GPU:-localhost/wattserve:gpu-steps}"
# vfs storage in a root of its own (scripts/containers-storage.conf), chroot isolation: no
# overlay filesystem, no container runtime needed for RUN steps.
export CONTAINERS_STORAGE_CONF="${CONTAINERS_STORAGE_CONF:-$PWD/scripts/containers-storage.conf}"
export BUILDAH_ISOLATION=chroot
MIRROR="${WATTSERVE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${WATTSERVE_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"

for tool in mmdebstrap buildah; do
  command -v "$tool" >/dev/null || { echo "needs $tool: apt-get install -y mmdebstrap buildah podman uidmap" >&2; exit 2; }
done

log() { echo "[build_image $(date -u +%H:%M:%S)] $*" >&2; }

# The base: what python:3.11-slim gives the Dockerfiles (python3 3.11 with venv and pip,
# CA certificates, tzdata, netbase), from Debian's own packages; pip comes into each venv
# through ensurepip (python3.11-venv brings its wheel), as the Dockerfiles make venvs. minbase + docs/man/locales
# left out as Debian's -slim images do. /usr/local/bin/python3 -> /usr/bin/python3.11 so that
# paths written for python:3.11-slim hold.
build_base() {
  if [ "${WATTSERVE_REBUILD_BASE:-0}" != 1 ] && buildah inspect --type image "$BASE" >/dev/null 2>&1; then
    log "base $BASE exists (WATTSERVE_REBUILD_BASE=1 to make it again)"
    return
  fi
  local work
  work="$(mktemp -d /tmp/wattserve-base.XXXXXX)"
  log "mmdebstrap bookworm -> $work/rootfs.tar"
  mmdebstrap --variant=minbase --mode=root --format=tar \
    --include=python3.11,python3.11-venv,ca-certificates,tzdata,netbase \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --customize-hook='ln -sf /usr/bin/python3 "$1/usr/local/bin/python3"; ln -sf /usr/bin/python3 "$1/usr/local/bin/python"' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    bookworm "$work/rootfs.tar" \
    "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" \
    "deb $SECURITY_MIRROR bookworm-security main"
  log "importing as $BASE"
  local ctr
  ctr="$(buildah from scratch)"
  buildah add "$ctr" "$work/rootfs.tar" / >/dev/null
  buildah config --env LANG=C.UTF-8 --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd python3 --label org.opencontainers.image.description="Debian bookworm + python3.11 (mmdebstrap)" "$ctr"
  buildah commit --rm "$ctr" "$BASE" >/dev/null
  rm -rf "$work"
}

# The local package sources pip is configured with on this machine, as bud flags.
PIP_FLAGS=()
pip_sources() {
  local config indexes="" links="" path
  config="$(python3 -m pip config list 2>/dev/null || true)"
  for url in $(sed -n "s/^[a-z:.]*extra-index-url='\(.*\)'$/\1/p" <<<"$config") ${PIP_EXTRA_INDEX_URL:-}; do
    indexes="$indexes $url"
    if [[ "$url" == file://* ]]; then
      path="${url#file://}"
      path="${path%/simple*}"  # the index's folder: its files/ lie beside simple/
      [ -d "$path" ] && PIP_FLAGS+=(-v "$path:$path:ro")
    fi
  done
  for path in $(sed -n "s/^[a-z:.]*find-links='\(.*\)'$/\1/p" <<<"$config") ${PIP_FIND_LINKS:-}; do
    if [ -d "$path" ] && [[ " $links " != *" $path "* ]]; then
      links="$links $path"
      PIP_FLAGS+=(-v "$path:$path:ro")
    fi
  done
  # A constraints file (this machine caps torch at the release on its disk) goes in as well.
  path="$(sed -n "s/^[a-z:.]*constraint='\(.*\)'$/\1/p" <<<"$config" | head -n 1)"
  if [ -f "$path" ]; then
    PIP_FLAGS+=(-v "$path:$path:ro" --build-arg "PIP_CONSTRAINT=$path")
  fi
  # The CA bundle pip trusts here (it may hold a proxy's CA that Debian's bundle lacks).
  path="$(sed -n "s/^[a-z:.]*cert='\(.*\)'$/\1/p" <<<"$config" | head -n 1)"
  path="${PIP_CERT:-$path}"
  if [ -f "$path" ]; then
    PIP_FLAGS+=(-v "$path:/run/pip-ca.crt:ro" --build-arg "PIP_CERT=/run/pip-ca.crt")
  fi
  # pip takes several URLs in one variable, space-separated.
  indexes="$(tr ' ' '\n' <<<"$indexes" | awk 'NF && !seen[$0]++' | paste -sd' ')"
  links="${links# }"
  if [ -n "$indexes" ]; then PIP_FLAGS+=(--build-arg "PIP_EXTRA_INDEX_URL=$indexes"); fi
  if [ -n "$links" ]; then PIP_FLAGS+=(--build-arg "PIP_FIND_LINKS=$links"); fi
  log "pip sources for the build: index ${indexes:-PyPI only}; find-links ${links:-none}"
}

# PyPI's torch for x86_64 Linux is the CUDA build (its wheel ~550 MB plus several GB of
# nvidia-* wheels); the CPU-only builds live on PyTorch's own index (download.pytorch.org),
# which this machine cannot reach. A CPU-only torch wheel on local disk (find-links) is used
# only with a CPU-only torchvision beside it: PyPI's torchvision is built against CUDA torch,
# and with a CPU torch its import fails ("operator torchvision::nms does not exist"). Without
# the pair: pip's own choice under the machine's constraints (the CUDA build).
torch_packages() {
  if [ -n "${WATTSERVE_TORCH_PACKAGES:-}" ]; then
    echo "$WATTSERVE_TORCH_PACKAGES"; return
  fi
  local torch_wheel vision_wheel version minor
  for dir in $( { python3 -m pip config list 2>/dev/null | sed -n "s/^[a-z:.]*find-links='\(.*\)'$/\1/p"; \
                  tr ' ' '\n' <<<"${PIP_FIND_LINKS:-}"; } | awk 'NF && !seen[$0]++'); do
    torch_wheel="$(find "$dir" -maxdepth 1 -name 'torch-*+cpu-cp311-*x86_64.whl' | sort -V | tail -n 1)"
    [ -n "$torch_wheel" ] || continue
    version="$(basename "$torch_wheel" | cut -d- -f2)"    # 2.13.0+cpu
    minor="$(cut -d. -f2 <<<"$version")"                   # 13 -> torchvision 0.28
    vision_wheel="$(find "$dir" -maxdepth 1 -name "torchvision-0.$((minor + 15)).*+cpu-cp311-*x86_64.whl" | sort -V | tail -n 1)"
    if [ -n "$vision_wheel" ]; then
      echo "torch==$version torchvision==$(basename "$vision_wheel" | cut -d- -f2)"; return
    fi
    log "$torch_wheel has no CPU-only torchvision beside it: using the CUDA torch build"
  done
  echo "torch torchvision"
}

build_cpu() {
  build_base
  pip_sources
  local torch start
  torch="$(torch_packages)"
  # --format docker: the OCI image format has no HEALTHCHECK (buildah drops it with a warning).
  log "buildah bud Dockerfile.cpu -> $CPU_TAG (torch: $torch)"
  start=$(date +%s)
  buildah bud --layers=false --isolation chroot --pull=never --format docker \
    --build-arg "BASE_IMAGE=$BASE" --build-arg "TORCH_PACKAGES=$torch" --build-arg TORCH_INDEX_URL= \
    "${PIP_FLAGS[@]}" -f Dockerfile.cpu -t "$CPU_TAG" .
  log "CPU image built in $(( $(date +%s) - start )) s"
  image_size "$CPU_TAG"
}

# Every step of the CUDA Dockerfile after its FROM, on the Debian base: apt, the venv, pip with
# the CUDA wheels (torch's, onnxruntime-gpu, tensorrt-cu12) and the package checks. What cannot
# run without NVIDIA's base (pycuda needs cuda.h, the CUDA toolkit's header) is skipped by the
# Dockerfile's own guard, which says so in the build log.
build_gpu() {
  build_base
  pip_sources
  local start
  log "buildah bud Dockerfile (CUDA steps on $BASE) -> $GPU_TAG"
  start=$(date +%s)
  buildah bud --layers=false --isolation chroot --pull=never --format docker \
    --build-arg "BASE_IMAGE=$BASE" --build-arg "RUNTIME_IMAGE=$BASE" \
    --build-arg TORCH_INDEX_URL= --build-arg NVIDIA_INDEX_URL= --build-arg CUDA_OPTIONAL=1 \
    "${PIP_FLAGS[@]}" -f Dockerfile -t "$GPU_TAG" .
  log "CUDA-steps image built in $(( $(date +%s) - start )) s"
  image_size "$GPU_TAG"
}

image_size() {
  local bytes
  bytes="$(buildah inspect --type image --format '{{.ImageSize}}' "$1" 2>/dev/null || echo 0)"
  if [ "$bytes" = 0 ] || [ -z "$bytes" ]; then
    bytes="$(podman image inspect --format '{{.Size}}' "$1")"
  fi
  log "$1: $bytes bytes ($(awk -v b="$bytes" 'BEGIN { printf "%.2f GB", b / 1e9 }'))"
}

case "$TARGET" in
  base) build_base ;;
  cpu) build_cpu ;;
  gpu) build_gpu ;;
  all) build_cpu; build_gpu ;;
  *) echo "usage: $0 [base|cpu|gpu|all]" >&2; exit 2 ;;
esac
