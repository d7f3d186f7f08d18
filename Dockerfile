# GPU image: CUDA + cuDNN + TensorRT + pycuda. NOT BUILT HERE: the development machine has
# no Docker engine and no GPU, so this file is written against the public images and is
# untested. Build: docker build -t wattserve:gpu .   Run: docker run --gpus all -p 8000:8000 wattserve:gpu
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
# pycuda compiles against the CUDA headers of this -devel image.
RUN pip install --upgrade pip && pip install '.[onnx,diffusion,tensorrt]'

ENV WATTSERVE_HOST=0.0.0.0 WATTSERVE_PORT=8000 WATTSERVE_DEVICE=auto
EXPOSE 8000
STOPSIGNAL SIGTERM
CMD ["wattserve", "serve"]
