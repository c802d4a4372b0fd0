"""protos/ against upstream: every message, field, enum value and RPC the project's .proto files declare
exists in the installed upstream packages (xds-protos, smg-grpc-proto) with the same number, type and
label. The Rust wire types are generated from protos/, so a wrong number there would compile and
decode silently to a default; here it fails, naming the message, the field and both values."""

from __future__ import annotations

import importlib
import importlib.resources
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool

PROTOS = Path(__file__).resolve().parent.parent / "protos"

# Importing these registers upstream's descriptors (and their imports) in the default pool.
UPSTREAM_MODULES = (
    "envoy.service.ext_proc.v3.external_processor_pb2",
    "grpc_health.v1.health_pb2",
    "smg_grpc_proto.generated.common_pb2",
    "smg_grpc_proto.generated.vllm_engine_pb2",
    "smg_grpc_proto.generated.sglang_scheduler_pb2",
)

# Declarations newer than the installed xds-protos, checked by hand against Envoy's API (1.38+: a local
# response streamed in parts); the installed package still numbers `request_drain` 11 in ProcessingResponse.
# Envoy itself is the judge: the Responses API's streamed answers go through it in tests/integration.
NEWER_THAN_INSTALLED = {
    "envoy.service.ext_proc.v3.StreamedImmediateResponse",
    "envoy.service.ext_proc.v3.ProcessingResponse.streamed_immediate_response",
}

Field = descriptor_pb2.FieldDescriptorProto
Message = descriptor_pb2.DescriptorProto
Enum = descriptor_pb2.EnumDescriptorProto


def compile_protos(root: Path, out: Path) -> descriptor_pb2.FileDescriptorSet:
    """The .proto files under `root`, compiled by grpcio-tools' protoc into descriptors (written to `out`)."""
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*.proto"))
    assert files, f"no .proto files under {root}"
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{root}",
            f"-I{well_known}",
            f"--descriptor_set_out={out}",
            *files,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, f"protoc failed on {root}:\n{run.stderr}"
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


@cache
def project_descriptors() -> descriptor_pb2.FileDescriptorSet:
    with tempfile.TemporaryDirectory() as tmp:
        return compile_protos(PROTOS, Path(tmp) / "descriptors.pb")


def upstream_pool() -> descriptor_pool.DescriptorPool:
    for module in UPSTREAM_MODULES:
        importlib.import_module(module)
    return descriptor_pool.Default()


@cache
def upstream_file(name: str) -> descriptor_pb2.FileDescriptorProto:
    return descriptor_pb2.FileDescriptorProto.FromString(upstream_pool().FindFileByName(name).serialized_pb)


def declarations(
    f: descriptor_pb2.FileDescriptorProto,
) -> dict[str, Message | Enum | descriptor_pb2.ServiceDescriptorProto]:
    """Every message (nested ones too), enum and service of a file, by full name."""
    out: dict[str, Message | Enum | descriptor_pb2.ServiceDescriptorProto] = {}

    def walk(prefix: str, messages: list[Message], enums: list[Enum]) -> None:
        for e in enums:
            out[prefix + e.name] = e
        for m in messages:
            out[prefix + m.name] = m
            walk(f"{prefix}{m.name}.", list(m.nested_type), list(m.enum_type))

    walk(f"{f.package}.", list(f.message_type), list(f.enum_type))
    for s in f.service:
        out[f"{f.package}.{s.name}"] = s
    return out


def upstream_declaration(full_name: str) -> tuple[object | None, str]:
    """Upstream's declaration of `full_name` and the syntax of its file, or (None, "")."""
    pool = upstream_pool()
    for find in (pool.FindMessageTypeByName, pool.FindEnumTypeByName, pool.FindServiceByName):
        try:
            file = find(full_name).file
        except KeyError:
            continue
        f = upstream_file(file.name)
        return declarations(f)[full_name], f.syntax or "proto2"
    return None, ""


def field_facts(m: Message, f: Field) -> dict[str, object]:
    """What decides a field's wire form and generated type."""
    return {
        "number": f.number,
        "type": Field.Type.Name(f.type),
        "label": Field.Label.Name(f.label),
        "type_name": f.type_name,
        "oneof": m.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else None,
        "proto3_optional": f.proto3_optional,
    }


def message_problems(name: str, ours: Message, theirs: Message) -> list[str]:
    problems = []
    if ours.options.map_entry != theirs.options.map_entry:
        problems.append(
            f"{name}: map_entry: protos/ {ours.options.map_entry} != upstream {theirs.options.map_entry}"
        )
    upstream_fields = {f.name: f for f in theirs.field}
    for f in ours.field:
        if f"{name}.{f.name}" in NEWER_THAN_INSTALLED:
            continue
        if f.name not in upstream_fields:
            problems.append(f"{name}.{f.name}: upstream has no such field")
            continue
        mine, real = field_facts(ours, f), field_facts(theirs, upstream_fields[f.name])
        problems += [
            f"{name}.{f.name}: {fact}: protos/ {mine[fact]!r} != upstream {real[fact]!r}"
            for fact in mine
            if mine[fact] != real[fact]
        ]
    reserved = [(r.start, r.end) for r in theirs.reserved_range]
    for r in ours.reserved_range:
        if not any(start <= r.start and r.end <= end for start, end in reserved):
            problems.append(f"{name}: reserved {r.start}..{r.end - 1}: not reserved upstream")
    return problems


def enum_problems(name: str, ours: Enum, theirs: Enum) -> list[str]:
    upstream_values = {v.name: v.number for v in theirs.value}
    problems = []
    for v in ours.value:
        if v.name not in upstream_values:
            problems.append(f"{name}.{v.name}: upstream has no such value")
        elif v.number != upstream_values[v.name]:
            problems.append(
                f"{name}.{v.name}: number: protos/ {v.number} != upstream {upstream_values[v.name]}"
            )
    return problems


def service_problems(name: str, ours: descriptor_pb2.ServiceDescriptorProto, theirs: object) -> list[str]:
    assert isinstance(theirs, descriptor_pb2.ServiceDescriptorProto)
    upstream_methods = {m.name: m for m in theirs.method}
    problems = []
    for m in ours.method:
        real = upstream_methods.get(m.name)
        if real is None:
            problems.append(f"{name}.{m.name}: upstream has no such method")
            continue
        for fact in ("input_type", "output_type", "client_streaming", "server_streaming"):
            mine, upstream = getattr(m, fact), getattr(real, fact)
            if mine != upstream:
                problems.append(f"{name}.{m.name}: {fact}: protos/ {mine!r} != upstream {upstream!r}")
    return problems


def problems(fds: descriptor_pb2.FileDescriptorSet) -> list[str]:
    """Every way the compiled project protos differ from upstream."""
    out = []
    for f in fds.file:
        for name, ours in declarations(f).items():
            if name in NEWER_THAN_INSTALLED:
                continue
            theirs, syntax = upstream_declaration(name)
            if theirs is None:
                out.append(f"{name} ({f.name}): upstream has no such declaration")
                continue
            if (f.syntax or "proto2") != syntax:
                out.append(f"{name} ({f.name}): syntax: protos/ {f.syntax!r} != upstream {syntax!r}")
            if isinstance(ours, Message):
                assert isinstance(theirs, Message)
                out += message_problems(name, ours, theirs)
            elif isinstance(ours, Enum):
                assert isinstance(theirs, Enum)
                out += enum_problems(name, ours, theirs)
            else:
                out += service_problems(name, ours, theirs)
    return out


def test_every_declaration_in_protos_matches_upstream() -> None:
    found = problems(project_descriptors())
    assert not found, "protos/ differs from upstream:\n" + "\n".join(found)


def test_protos_cover_each_wire_contract() -> None:
    """The packages the Rust code includes (src/pb) all come from protos/."""
    packages = {f.package for f in project_descriptors().file}
    assert packages == {
        "envoy.service.ext_proc.v3",
        "envoy.config.core.v3",
        "envoy.type.v3",
        "vllm.grpc.engine",
        "sglang.grpc.scheduler",
        "smg.grpc.common",
        "grpc.health.v1",
    }


@pytest.mark.parametrize(
    ("path", "old", "new", "expected"),
    [
        (
            "smg/vllm_engine.proto",
            "uint32 index = 7;",
            "uint32 index = 6;",
            "vllm.grpc.engine.GenerateStreamChunk.index: number: protos/ 6 != upstream 7",
        ),
        (
            "envoy/config/core/v3/base.proto",
            "bytes raw_value = 3;",
            "string raw_value = 3;",
            "envoy.config.core.v3.HeaderValue.raw_value: type: "
            "protos/ 'TYPE_STRING' != upstream 'TYPE_BYTES'",
        ),
        (
            "smg/common.proto",
            "KV_CACHE_TIER_HOST = 2;",
            "KV_CACHE_TIER_HOST = 7;",
            "smg.grpc.common.KvCacheTier.KV_CACHE_TIER_HOST: number: protos/ 7 != upstream 2",
        ),
        (
            "smg/sglang_scheduler.proto",
            "optional int32 data_parallel_rank = 16;",
            "int32 data_parallel_rank = 16;",
            "sglang.grpc.scheduler.GenerateRequest.data_parallel_rank: oneof: "
            "protos/ None != upstream '_data_parallel_rank'",
        ),
    ],
)
def test_a_changed_declaration_is_reported(
    tmp_path: Path, path: str, old: str, new: str, expected: str
) -> None:
    copy = tmp_path / "protos"
    shutil.copytree(PROTOS, copy)
    source = (copy / path).read_text()
    assert source.count(old) == 1, f"{path} no longer holds {old!r}"
    (copy / path).write_text(source.replace(old, new))
    assert expected in problems(compile_protos(copy, tmp_path / "descriptors.pb"))
