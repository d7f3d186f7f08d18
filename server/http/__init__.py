"""The HTTP front end: KServe v2 / Triton over HTTP, translated to and from ``server.core``.

``protocol`` (connection guards on uvicorn's protocol), ``fast_path`` (the infer route past
the middleware stack), ``middleware``, ``status`` (status kind -> HTTP status), ``codec``
(JSON and the binary extension), ``schemas`` (OpenAPI only), ``image_preprocess`` and
``preprocess_threads`` (the image routes' torchvision work), ``routes/`` (routers by
concern). Nothing here imports ``server.grpc``.
"""
