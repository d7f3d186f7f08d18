"""The protocol-neutral core both front ends translate to and from.

``admission`` (select, admit, ``Refused``: the one path every request takes), ``decode``
(the one inference decode harness and the shared body budget) and ``documents`` (the
metadata, configuration and statistics documents both serve). Nothing here imports a web
or RPC framework or a front end: HTTP is ``server/routes/`` (plus the ASGI pieces
``fast_path``, ``middleware``, ``security``, ``http_protocol``, ``http_status``), gRPC is
``server/grpc_*.py``; ``tests/test_layering.py`` keeps it so.
"""
