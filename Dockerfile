# GPU image: CUDA 12 + cuDNN 9 + onnxruntime-gpu + TensorRT 10 (cu12) + pycuda.
#   docker build -t wattserve:gpu .   docker run --gpus all -p 8000:8000 -p 8001:8001 wattserve:gpu
# Settings: -e WATTSERVE_MODEL=resnet50 ..., or flags after the image name, which win over the
#   variables: docker run ... wattserve:gpu wattserve serve --model resnet50 --batcher static
# One CUDA major throughout: the base image's CUDA 12.6 / cuDNN 9, torch from PyTorch's cu126
# index, onnxruntime-gpu (its PyPI builds since 1.19 are CUDA 12 + cuDNN 9), tensorrt-cu12
# (TensorRT 10, what engines/tensorrt_engine.py is written for), and pycuda compiled against
# this image's headers.
#
# NOT PULLED ON THE DEVELOPMENT MACHINE: nvidia/cuda cannot be pulled there (no registry, no
# GPU). scripts/build_image.sh gpu builds every step after FROM on a Debian bookworm base made
# there (BASE_IMAGE and RUNTIME_IMAGE pointed at it, CUDA_OPTIONAL=1): apt, the venv, pip with
# the CUDA torch and onnxruntime-gpu, the package checks, the runtime stage. Two steps cannot
# run there and say SKIPPED in the log: TensorRT (its wheels come only from pypi.nvidia.com,
# not reachable there) and pycuda's compile against cuda.h (the CUDA toolkit's header). With
# the defaults (CUDA_OPTIONAL=0) either one missing fails the build instead.
# Two stages: the compiler, python3.11-dev and the CUDA headers (the -devel base, ~4 GB more)
# stay in the first; the runtime stage is the -runtime base plus the virtual environment.
ARG BASE_IMAGE=nvidia/cuda:12.6.3-cudnn-devel-ubuntu22.04
ARG RUNTIME_IMAGE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu22.04

FROM ${BASE_IMAGE} AS build
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3.11 python3.11-venv python3.11-dev build-essential \
    && rm -rf /var/lib/apt/lists/*
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# Empty TORCH_INDEX_URL / NVIDIA_INDEX_URL: only pip's configured indexes (scripts/build_image.sh
# passes the machine's own as PIP_EXTRA_INDEX_URL / PIP_FIND_LINKS / PIP_CONSTRAINT / PIP_CERT).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126
ARG NVIDIA_INDEX_URL=https://pypi.nvidia.com
ARG CUDA_OPTIONAL=0
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_CONSTRAINT
ARG PIP_CERT
RUN pip install --upgrade pip \
    && pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch torchvision
WORKDIR /src
COPY pyproject.toml README.md ./
COPY wattserve ./wattserve
COPY server ./server
COPY batchers ./batchers
COPY engines ./engines
COPY telemetry ./telemetry
COPY loadgen ./loadgen
# Not the [onnx] extra: it names the CPU 'onnxruntime', and with both installed whichever
# landed last owns the 'onnxruntime' module. onnxruntime-gpu alone, then check that.
RUN pip install '.[diffusion]' 'onnx>=1.16' 'onnxscript>=0.1' 'onnxruntime-gpu>=1.19' \
    && python -c "import importlib.metadata as md; \
names = {d.metadata['Name'].lower() for d in md.distributions()}; \
assert 'onnxruntime' not in names, 'the CPU onnxruntime is installed beside onnxruntime-gpu'; \
print('onnxruntime-gpu', md.version('onnxruntime-gpu'), 'torch', md.version('torch'))"
# The [tensorrt] extra's two parts apart. TensorRT 10 on PyPI is stub sdists that download
# the wheels from NVIDIA's index while installing (no binary wheels on PyPI); pycuda compiles
# against the CUDA toolkit's cuda.h, which only the nvidia/cuda -devel base has.
RUN if [ -n "$NVIDIA_INDEX_URL" ]; then \
        pip install --extra-index-url "$NVIDIA_INDEX_URL" 'tensorrt-cu12>=10,<11' \
        && python -c "import importlib.metadata as md; v = md.version('tensorrt-cu12'); \
assert v.split('.')[0] == '10', v; print('tensorrt-cu12', v)"; \
    elif [ "$CUDA_OPTIONAL" = 1 ]; then \
        echo "SKIPPED: tensorrt-cu12 (no NVIDIA_INDEX_URL; CUDA_OPTIONAL=1)"; \
    else \
        echo "tensorrt-cu12 needs NVIDIA's index (NVIDIA_INDEX_URL)" >&2; exit 1; \
    fi
RUN if [ -e /usr/local/cuda/include/cuda.h ]; then \
        PATH=/usr/local/cuda/bin:$PATH pip install 'pycuda>=2024.1' && python -c "import pycuda; print('pycuda', pycuda.VERSION_TEXT)"; \
    elif [ "$CUDA_OPTIONAL" = 1 ]; then \
        echo "SKIPPED: pycuda (no /usr/local/cuda/include/cuda.h in this base; CUDA_OPTIONAL=1)"; \
    else \
        echo "no /usr/local/cuda/include/cuda.h: this base is not a CUDA -devel image" >&2; exit 1; \
    fi

FROM ${RUNTIME_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin wattserve
COPY --from=build /opt/venv /opt/venv
# tensorrt is not imported here: its libraries look for the driver, which a build host may lack.
RUN python -c "import wattserve.server.cli, torch, onnxruntime; print('torch', torch.__version__)"
USER wattserve
WORKDIR /home/wattserve
# Metrics are served on the HTTP port (/metrics), not on a port of their own.
ENV WATTSERVE_HOST=0.0.0.0 WATTSERVE_PORT=8000 WATTSERVE_GRPC_PORT=8001 WATTSERVE_DEVICE=auto
EXPOSE 8000 8001
# python, not curl: the image has no curl. Ready = warmed up and not draining; the start
# period covers TensorRT plans built on first start.
HEALTHCHECK --interval=10s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('WATTSERVE_PORT', '8000') + '/v2/health/ready', timeout=4).status != 200)"]
# Exec form: the server is PID 1 and gets SIGTERM itself (uvicorn's handler starts the drain).
STOPSIGNAL SIGTERM
CMD ["wattserve", "serve"]
