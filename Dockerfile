# GPU image: CUDA 12 + cuDNN 9 + onnxruntime-gpu + TensorRT 10 (cu12) + pycuda. NOT BUILT HERE:
# the development machine has no Docker engine and no GPU, so this file is written against the
# public images and package indexes and is untested.
#   docker build -t wattserve:gpu .   docker run --gpus all -p 8000:8000 wattserve:gpu
# Settings: -e WATTSERVE_MODEL=resnet50 ..., or flags after the image name, which win over the
#   variables: docker run ... wattserve:gpu wattserve serve --model resnet50 --batcher static
# One CUDA major throughout: the base image's CUDA 12.6 / cuDNN 9, onnxruntime-gpu (its PyPI
# builds since 1.19 are CUDA 12 + cuDNN 9), tensorrt-cu12 (TensorRT 10, what
# engines/tensorrt_engine.py is written for), and pycuda compiled against this image's headers.
FROM nvidia/cuda:12.6.3-cudnn-devel-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3.11 python3.11-venv python3.11-dev build-essential \
    && rm -rf /var/lib/apt/lists/*
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /app
COPY pyproject.toml README.md ./
COPY server ./server
COPY batchers ./batchers
COPY engines ./engines
COPY telemetry ./telemetry
COPY loadgen ./loadgen
# Not the [onnx] extra: it names the CPU 'onnxruntime', and with both installed whichever
# landed last owns the 'onnxruntime' module. onnxruntime-gpu alone, then check that.
# tensorrt-cu12's libraries come from NVIDIA's index.
RUN pip install --upgrade pip \
    && pip install --extra-index-url https://pypi.nvidia.com \
        '.[diffusion,tensorrt]' 'onnx>=1.16' 'onnxscript>=0.1' 'onnxruntime-gpu>=1.19' \
    && python -c "import importlib.metadata as md; \
names = {d.metadata['Name'].lower() for d in md.distributions()}; \
assert 'onnxruntime' not in names, 'the CPU onnxruntime is installed beside onnxruntime-gpu'; \
assert md.version('tensorrt-cu12').split('.')[0] == '10', md.version('tensorrt-cu12'); \
print('onnxruntime-gpu', md.version('onnxruntime-gpu'), 'tensorrt-cu12', md.version('tensorrt-cu12'))"

ENV WATTSERVE_HOST=0.0.0.0 WATTSERVE_PORT=8000 WATTSERVE_DEVICE=auto
EXPOSE 8000
STOPSIGNAL SIGTERM
CMD ["wattserve", "serve"]
