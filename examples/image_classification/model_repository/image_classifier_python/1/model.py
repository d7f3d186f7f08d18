"""The whole pipeline in one Triton Python model: decode and normalize each image, run the
classifier (ONNX Runtime, in this process), top-k labels. The baseline the ensemble
(preprocess -> classifier -> postprocess) is measured against; same code, same model file
(build_repository.py copies classifier's model.onnx into this model's version folder)."""

import io
import json
import os

import numpy as np
import onnxruntime
import triton_python_backend_utils as pb_utils
from PIL import Image

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)
SIZE = 64


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.k = pb_utils.get_output_config_by_name(config, "LABELS")["dims"][0]
        model_dir = args["model_repository"]
        with open(os.path.join(model_dir, "labels.txt")) as f:
            self.labels = [line.strip() for line in f if line.strip()]
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1  # as the ensemble's classifier runs (its torch_threads)
        path = os.path.join(model_dir, args["model_version"], "model.onnx")
        self.session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def pixels(self, data):
        image = Image.open(io.BytesIO(data)).convert("RGB").resize((SIZE, SIZE), Image.BILINEAR)
        chw = np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / 255.0
        return (chw - MEAN) / STD

    def execute(self, requests):
        images = [pb_utils.get_input_tensor_by_name(r, "IMAGE").as_numpy() for r in requests]
        pixels = np.stack([self.pixels(row[0]) for part in images for row in part]).astype(np.float32)
        (rows,) = self.session.run(["LOGITS"], {"PIXELS": pixels})
        exp = np.exp(rows - rows.max(axis=1, keepdims=True))
        probs = exp / exp.sum(axis=1, keepdims=True)
        top = np.argsort(-probs, axis=1)[:, : self.k]
        labels = np.array(
            [[f"{probs[i, j]:.6f}:{j}:{self.labels[j]}".encode() for j in top[i]] for i in range(len(rows))],
            dtype=object,
        )
        responses, start = [], 0
        for part in images:
            tensor = pb_utils.Tensor("LABELS", labels[start : start + len(part)])
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
            start += len(part)
        return responses
