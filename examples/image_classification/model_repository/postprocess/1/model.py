"""Triton Python model: logits -> the top-k classes as "score:index:label" strings (BYTES),
Triton's classification format; k is the LABELS output's size in the config.

All the requests of a batch are scored in one vectorized pass, then split back."""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.k = pb_utils.get_output_config_by_name(config, "LABELS")["dims"][0]
        with open(os.path.join(args["model_repository"], "labels.txt")) as f:
            self.labels = [line.strip() for line in f if line.strip()]

    def execute(self, requests):
        logits = [pb_utils.get_input_tensor_by_name(r, "LOGITS").as_numpy() for r in requests]
        rows = np.concatenate(logits)
        exp = np.exp(rows - rows.max(axis=1, keepdims=True))
        probs = exp / exp.sum(axis=1, keepdims=True)
        top = np.argsort(-probs, axis=1)[:, : self.k]
        labels = np.array(
            [[f"{probs[i, j]:.6f}:{j}:{self.labels[j]}".encode() for j in top[i]] for i in range(len(rows))],
            dtype=object,
        )
        responses, start = [], 0
        for part in logits:
            tensor = pb_utils.Tensor("LABELS", labels[start : start + len(part)])
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
            start += len(part)
        return responses
