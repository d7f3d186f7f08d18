"""Regenerate server/models/repository/model_config_pb2.pyi (type stubs for the vendored protoc output).

mypy-protobuf is a protoc plugin; protoc is not needed: the vendored module carries its own
FileDescriptorProto, which is all the plugin reads. Run after re-vendoring model_config_pb2.py:
    pip install mypy-protobuf && python scripts/gen_model_config_stub.py
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from google.protobuf import descriptor_pb2
from google.protobuf.compiler import plugin_pb2
from mypy_protobuf.main import Descriptors, generate_mypy_stubs

MODULE = Path(__file__).resolve().parents[1] / "server" / "repository" / "model_config_pb2.py"


def main() -> None:
    spec = importlib.util.spec_from_file_location("model_config_pb2", MODULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    proto = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
    request = plugin_pb2.CodeGeneratorRequest(file_to_generate=[proto.name], proto_file=[proto])
    response = plugin_pb2.CodeGeneratorResponse()
    generate_mypy_stubs(Descriptors(request), response, True, False, False, False, False)
    (generated,) = response.file
    MODULE.with_suffix(".pyi").write_text(generated.content)
    print(f"wrote {MODULE.with_suffix('.pyi')} ({len(generated.content)} characters)")


if __name__ == "__main__":
    main()
