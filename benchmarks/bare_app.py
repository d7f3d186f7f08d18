"""A bare FastAPI endpoint doing the identity model's work with no batching: the ceiling
wattserve's own overhead is measured against (benchmarks/serving_overhead.py)."""

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

app = FastAPI()


@app.post("/v2/models/identity/infer")
async def infer(request: Request) -> Response:
    doc = orjson.loads(await request.body())
    tensor = doc["inputs"][0]
    data = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"]).copy()
    out = {"name": "OUTPUT0", "datatype": "FP32", "shape": list(data.shape), "data": data.ravel()}
    body = {"model_name": "identity", "model_version": "1", "outputs": [out]}
    return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")
