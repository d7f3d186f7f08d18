"""The protocol-neutral core both front ends translate to and from.

``request`` (``InferRequest``, ``BadRequest`` and the checks both codecs share),
``admission`` (select, admit, ``Refused``: the one path every request takes), ``decode``
(the one inference decode harness and the shared body budget), ``documents`` (the
metadata, configuration and statistics documents both serve), ``inprocess`` and
``model_caller`` (one model calling another without a protocol), ``decoupled`` and
``token_stream`` (responses streamed from engine threads), ``bytes_tensors``. Nothing here
imports a web or RPC framework or a front end (``server/http/``, ``server/grpc/``);
``tests/test_layering.py`` keeps it so.
"""
