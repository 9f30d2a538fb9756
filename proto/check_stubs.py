#!/usr/bin/env python3
"""List the wire contract of the vendored protos as the engines' servicers see it.

The engines' Python servicers do not read our .proto files: they import the `*_pb2.py` stubs of
the `smg-grpc-proto` wheel, which embed serialized FileDescriptorProtos. This script loads those
stubs (with the `protobuf` runtime they were generated for) and prints one sorted line per
message, reserved range, field, enum value and RPC of the files we vendor. Its output is
committed as `stub-fields.txt`; the crate's test `field_numbers_match_the_servicers_stubs`
builds the same listing from the descriptors protox compiled out of `proto/*.proto` and asserts
the two are equal, so the check runs under `cargo test` without Python.

It also checks that each vendored .proto is byte-identical to the wheel's copy.

Usage (a throwaway venv; never the system python):
    python3 -m venv /tmp/stubs-venv
    /tmp/stubs-venv/bin/pip install protobuf==6.33.5   # the "Protobuf Python Version" in the pb2 headers
    /tmp/stubs-venv/bin/python proto/check_stubs.py path/to/smg_grpc_proto-X-py3-none-any.whl \
        > proto/stub-fields.txt

Line formats after a `#` header line (fields separated by one space):
    message <file> <message>
    reserved <file> <message> <start> <end>          (end exclusive, as in descriptor.proto)
    field <file> <message> <field> <number> <type> <label>
    enum <file> <enum> <value> <number>
    rpc <file> <service> <method> <input> <output> <client-streaming> <server-streaming>
where <type> is the scalar name or the fully qualified message/enum name, and <label> is
`repeated`, `optional` (proto3 explicit presence), `oneof:<name>` or `singular`.
"""

import hashlib
import importlib
import pathlib
import sys
import zipfile

# Keep in step with PROTO_FILES in build.rs.
VENDORED = [
    "common.proto",
    "sglang_scheduler.proto",
    "tokenspeed_encoder.proto",
    "tokenspeed_scheduler.proto",
    "vllm_engine.proto",
]

# FieldDescriptorProto.Type numbers -> names, as in descriptor.proto.
SCALAR_TYPES = {
    1: "double", 2: "float", 3: "int64", 4: "uint64", 5: "int32", 6: "fixed64", 7: "fixed32",
    8: "bool", 9: "string", 10: "group", 11: "message", 12: "bytes", 13: "uint32", 14: "enum",
    15: "sfixed32", 16: "sfixed64", 17: "sint32", 18: "sint64",
}
LABEL_REPEATED = 3


def field_type(field):
    if field.type_name:
        return field.type_name
    return SCALAR_TYPES[field.type]


def field_label(message, field):
    if field.label == LABEL_REPEATED:
        return "repeated"
    if field.proto3_optional:
        return "optional"
    if field.HasField("oneof_index"):
        return "oneof:" + message.oneof_decl[field.oneof_index].name
    return "singular"


def list_message(lines, file_name, scope, message):
    name = f"{scope}.{message.name}" if scope else message.name
    lines.append(f"message {file_name} {name}")
    for reserved in message.reserved_range:
        lines.append(f"reserved {file_name} {name} {reserved.start} {reserved.end}")
    for field in message.field:
        lines.append(
            f"field {file_name} {name} {field.name} {field.number} "
            f"{field_type(field)} {field_label(message, field)}"
        )
    for nested in message.nested_type:
        list_message(lines, file_name, name, nested)
    for enum in message.enum_type:
        list_enum(lines, file_name, name, enum)


def list_enum(lines, file_name, scope, enum):
    name = f"{scope}.{enum.name}" if scope else enum.name
    for value in enum.value:
        lines.append(f"enum {file_name} {name} {value.name} {value.number}")


def list_file(lines, fdp):
    for message in fdp.message_type:
        list_message(lines, fdp.name, fdp.package, message)
    for enum in fdp.enum_type:
        list_enum(lines, fdp.name, fdp.package, enum)
    for service in fdp.service:
        for method in service.method:
            lines.append(
                f"rpc {fdp.name} {fdp.package}.{service.name} {method.name} "
                f"{method.input_type} {method.output_type} "
                f"{str(method.client_streaming).lower()} {str(method.server_streaming).lower()}"
            )


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    wheel = pathlib.Path(sys.argv[1]).resolve()
    here = pathlib.Path(__file__).resolve().parent

    # The vendored copies must be the wheel's, byte for byte.
    with zipfile.ZipFile(wheel) as zf:
        for name in VENDORED:
            shipped = zf.read(f"smg_grpc_proto/proto/{name}")
            ours = (here / name).read_bytes()
            if shipped != ours:
                sys.exit(f"proto/{name} differs from the wheel's copy "
                         f"(wheel {hashlib.sha256(shipped).hexdigest()}, "
                         f"ours {hashlib.sha256(ours).hexdigest()})")

    # Import the stubs straight from the wheel (zipimport): nothing is installed.
    sys.path.insert(0, str(wheel))
    from google.protobuf import __version__ as protobuf_version
    from google.protobuf import descriptor_pb2

    lines = []
    for name in VENDORED:
        module = importlib.import_module(f"smg_grpc_proto.generated.{name[:-len('.proto')]}_pb2")
        if not pathlib.Path(module.__file__).is_relative_to(wheel):
            sys.exit(f"{module.__name__} was imported from {module.__file__}, not from {wheel}")
        fdp = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
        if fdp.name != name:
            sys.exit(f"{module.__name__} describes {fdp.name}, expected {name}")
        list_file(lines, fdp)

    # Comment lines are skipped by the Rust test.
    print(f"# proto/check_stubs.py {wheel.name} (stubs loaded with protobuf {protobuf_version})")
    for line in sorted(lines):
        print(line)


if __name__ == "__main__":
    main()
