"""The gRPC front end: Triton's ``inference.GRPCInferenceService`` on ``grpc.aio``.

``service`` (every RPC, through ``server.core.admission``), ``codec`` (ModelInferRequest <->
``InferRequest`` through ``server.core.request``'s checks), ``wire`` (a request's header read
from its wire bytes before parsing), ``access`` (restricted-API groups and the bearer token
from metadata). Nothing here imports ``server.http``.
"""
