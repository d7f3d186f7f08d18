"""Triton Python model: image bytes -> normalized FP32 pixels (CHW), one image per row.

Written for Triton's Python backend (``TritonPythonModel``, ``triton_python_backend_utils``);
wattserve serves it unchanged. An image that does not decode fails its own request only."""

import io
import json

import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        output = pb_utils.get_output_config_by_name(config, "PIXELS")
        self.dtype = pb_utils.triton_string_to_numpy(output["data_type"])
        self.height, self.width = output["dims"][1], output["dims"][2]

    def pixels(self, data):
        image = Image.open(io.BytesIO(data)).convert("RGB").resize((self.width, self.height), Image.BILINEAR)
        chw = np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / 255.0
        return (chw - MEAN) / STD

    def execute(self, requests):
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()  # [rows, 1] of bytes
            try:
                batch = np.stack([self.pixels(row[0]) for row in images]).astype(self.dtype)
            except Exception as exc:  # not an image (Pillow's UnidentifiedImageError, a truncated file)
                error = pb_utils.TritonError(
                    f"cannot decode the image: {exc}", pb_utils.TritonError.INVALID_ARG
                )
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("PIXELS", batch)]))
        return responses
