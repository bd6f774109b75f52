"""Loads the published smg-grpc-proto stubs for the interop scripts.

The interop peers (``smg_client.py``, ``smg_server.py`` and
``engine_client.py``) import this module first. It imports grpcio, protobuf and the generated modules of the
``smg-grpc-proto`` package, checks the minimum versions the stubs need, and
exits with status 3 and an install hint when something is missing.

Run on its own it is the interop test's preflight: it prints the versions
found as one JSON line. With ``--descriptors`` it prints instead the
published FileDescriptorProtos (base64 of their serialized bytes) of
common.proto, tokenspeed_scheduler.proto, tokenspeed_encoder.proto,
vllm_engine.proto and sglang_scheduler.proto, as embedded in the generated
modules, for the test to compare field by field with ours.
"""

import json
import sys

REQUIREMENTS = ".ci/requirements-interop.txt"
MIN_GRPCIO = (1, 81, 1)
MIN_PROTOBUF = (6, 33, 5)
SMG_VERSION = "0.4.28"


def _fail(message):
    sys.stderr.write(
        "interop peers need smg-grpc-proto=={smg}, grpcio>={grpc} and protobuf>={pb}: {msg}\n"
        "install them with: {py} -m pip install -r {req}\n"
        "(or point IRIS_PYTHON at an interpreter that has them)\n".format(
            smg=SMG_VERSION,
            grpc=".".join(map(str, MIN_GRPCIO)),
            pb=".".join(map(str, MIN_PROTOBUF)),
            msg=message,
            py=sys.executable,
            req=REQUIREMENTS,
        )
    )
    sys.exit(3)


def _version_tuple(text):
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


try:
    import grpc
    import google.protobuf
    from google.protobuf import json_format
    from smg_grpc_proto.generated import common_pb2
    from smg_grpc_proto.generated import tokenspeed_encoder_pb2
    from smg_grpc_proto.generated import tokenspeed_encoder_pb2_grpc
    from smg_grpc_proto.generated import tokenspeed_scheduler_pb2
    from smg_grpc_proto.generated import tokenspeed_scheduler_pb2_grpc
    from smg_grpc_proto.generated import vllm_engine_pb2
    from smg_grpc_proto.generated import vllm_engine_pb2_grpc
    from smg_grpc_proto.generated import sglang_scheduler_pb2
    from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc
except ImportError as err:  # pragma: no cover - exercised by the preflight
    _fail("import failed ({})".format(err))

try:
    from importlib.metadata import version as _dist_version

    SMG_INSTALLED = _dist_version("smg-grpc-proto")
except Exception:  # noqa: BLE001 - metadata is best effort
    SMG_INSTALLED = "unknown"

if _version_tuple(grpc.__version__) < MIN_GRPCIO:
    _fail("grpcio {} is too old".format(grpc.__version__))
if _version_tuple(google.protobuf.__version__) < MIN_PROTOBUF:
    _fail("protobuf {} is too old".format(google.protobuf.__version__))
if SMG_INSTALLED != SMG_VERSION:
    _fail("smg-grpc-proto {} is installed".format(SMG_INSTALLED))

__all__ = [
    "grpc",
    "json_format",
    "common_pb2",
    "tokenspeed_encoder_pb2",
    "tokenspeed_encoder_pb2_grpc",
    "tokenspeed_scheduler_pb2",
    "tokenspeed_scheduler_pb2_grpc",
    "vllm_engine_pb2",
    "vllm_engine_pb2_grpc",
    "sglang_scheduler_pb2",
    "sglang_scheduler_pb2_grpc",
    "to_dict",
]


def to_dict(message, defaults=False):
    """The proto3 JSON mapping of ``message`` with proto field names.

    64-bit integers come out as strings and bytes as base64, as the mapping
    prescribes. With ``defaults`` fields without presence are printed even
    when they hold their default value.
    """
    return json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=defaults,
    )


def published_descriptors():
    """File name -> base64 of the serialized FileDescriptorProto."""
    import base64

    return {
        module.DESCRIPTOR.name: base64.b64encode(module.DESCRIPTOR.serialized_pb).decode("ascii")
        for module in (
            common_pb2,
            tokenspeed_scheduler_pb2,
            tokenspeed_encoder_pb2,
            vllm_engine_pb2,
            sglang_scheduler_pb2,
        )
    }


if __name__ == "__main__" and sys.argv[1:] == ["--descriptors"]:
    print(json.dumps(published_descriptors()))
elif __name__ == "__main__":
    print(
        json.dumps(
            {
                "python": sys.version.split()[0],
                "grpcio": grpc.__version__,
                "protobuf": google.protobuf.__version__,
                "smg_grpc_proto": SMG_INSTALLED,
            }
        )
    )
