"""Pydantic models of the KServe v2 inference body, for the OpenAPI schema only.

The infer route itself is a plain Starlette route (FastAPI's parameter machinery cost ~100
µs a request), so FastAPI cannot see its body; these models describe it in /openapi.json so
that clients and schema-driven fuzzers can reach it. Validation stays in server.http.codec.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class InferTensor(BaseModel):
    name: str
    shape: list[int] = Field(description="Tensor shape; a leading batch dimension is optional.")
    datatype: str = Field(description="KServe datatype, e.g. FP32, INT64, BYTES.")
    parameters: dict[str, Any] | None = Field(None, description="e.g. binary_data_size")
    data: list[Any] | None = Field(None, description="Row-major values (absent with binary data).")


class RequestedOutput(BaseModel):
    name: str
    parameters: dict[str, Any] | None = Field(None, description="e.g. binary_data: true")


class InferRequestBody(BaseModel):
    id: str | None = None
    parameters: dict[str, Any] | None = Field(
        None, description="priority (0 = default level), timeout (µs), binary_data_output"
    )
    inputs: list[InferTensor]
    outputs: list[RequestedOutput] | None = None


class InferResponseBody(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    outputs: list[InferTensor]


class ErrorBody(BaseModel):
    error: str
