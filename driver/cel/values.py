"""The values of Kubernetes' CEL types in cel-expr-python: quantities, versions, IPs, CIDRs, URLs
and named formats as protobuf messages from a private descriptor pool (upstream's type names),
each carrying its exact value in one string field, so ``==`` means equal value; and a device
attribute as a CEL value."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Final

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from driver.api.model import AttributeValue, Version
from driver.api.quantity import Quantity
from driver.cel import (
    cost,
    library,
)

QUANTITY_TYPE_NAME: Final = "kubernetes.Quantity"
SEMVER_TYPE_NAME: Final = "kubernetes.Semver"
IP_TYPE_NAME: Final = "net.IP"
CIDR_TYPE_NAME: Final = "net.CIDR"
URL_TYPE_NAME: Final = "kubernetes.URL"
FORMAT_TYPE_NAME: Final = "kubernetes.NamedFormat"


def _build_value_types() -> tuple[Any, dict[str, type[Any]]]:
    string = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
    optional = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    pool = descriptor_pool.DescriptorPool()
    layout = {
        "kubernetes": (
            ("Quantity", "nanos"),
            ("Semver", "version"),
            ("URL", "value"),
            ("NamedFormat", "name"),
        ),
        "net": (("IP", "value"), ("CIDR", "value")),
    }
    for package, messages in layout.items():
        fdp = descriptor_pb2.FileDescriptorProto(
            name=f"biaxial/{package}_cel_types.proto", package=package, syntax="proto3"
        )
        for name, field_name in messages:
            msg = fdp.message_type.add(name=name)
            msg.field.add(name=field_name, number=1, type=string, label=optional)
        pool.Add(fdp)
    classes = {
        full: message_factory.GetMessageClass(pool.FindMessageTypeByName(full))
        for full in (
            QUANTITY_TYPE_NAME,
            SEMVER_TYPE_NAME,
            IP_TYPE_NAME,
            CIDR_TYPE_NAME,
            URL_TYPE_NAME,
            FORMAT_TYPE_NAME,
        )
    }
    return pool, classes


POOL, MESSAGE_CLASSES = _build_value_types()
QuantityMsg = MESSAGE_CLASSES[QUANTITY_TYPE_NAME]
SemverMsg = MESSAGE_CLASSES[SEMVER_TYPE_NAME]
IPMsg = MESSAGE_CLASSES[IP_TYPE_NAME]
CIDRMsg = MESSAGE_CLASSES[CIDR_TYPE_NAME]
URLMsg = MESSAGE_CLASSES[URL_TYPE_NAME]
FormatMsg = MESSAGE_CLASSES[FORMAT_TYPE_NAME]


def quantity_value(quantity: Quantity) -> Any:
    """A quantity as the CEL engine's ``kubernetes.Quantity`` value."""
    return QuantityMsg(nanos=str(quantity.nanos))


def semver_value(version: library.Semver) -> Any:
    return SemverMsg(version=version.precedence_text)


@lru_cache(maxsize=4096)
def _quantity_literal(text: str) -> Any:
    """``quantity(s)``; memoised (selectors call it with the same literal on every device).
    The engine copies the message, so sharing one is safe."""
    return quantity_value(library.parse_quantity(text))


def quantity_of(text: str) -> Any:
    cost.charge_traversal(len(text))
    return _quantity_literal(text)


@lru_cache(maxsize=4096)
def _semver_literal(text: str, normalize: bool = False) -> Any:
    """``semver(s[, normalize])``; memoised like :func:`_quantity_literal`."""
    return semver_value(library.parse_semver(text, normalize))


def semver_of(text: str, normalize: bool = False) -> Any:
    cost.charge_traversal(len(text))
    return _semver_literal(text, normalize)


def value_type_name(value: Any) -> str:
    for name, cls in MESSAGE_CLASSES.items():
        if isinstance(value, cls):
            return name
    return type(value).__name__


def to_quantity(msg: Any) -> Quantity:
    # Attribute values are dyn, so a Semver can reach a quantity member at run time.
    if not isinstance(msg, QuantityMsg):
        raise library.CELFunctionError(
            f"no such overload: {value_type_name(msg)} is not a quantity"
        )
    return Quantity(int(msg.nanos))


def to_semver(msg: Any) -> library.Semver:
    if not isinstance(msg, SemverMsg):
        raise library.CELFunctionError(f"no such overload: {value_type_name(msg)} is not a semver")
    return library.parse_semver(msg.version)


def ip_text(msg: Any) -> str:
    if not isinstance(msg, IPMsg):
        raise library.CELFunctionError(f"no such overload: {value_type_name(msg)} is not an IP")
    return str(msg.value)


def cidr_text(msg: Any) -> str:
    if not isinstance(msg, CIDRMsg):
        raise library.CELFunctionError(f"no such overload: {value_type_name(msg)} is not a CIDR")
    return str(msg.value)


def url_text(msg: Any) -> str:
    if not isinstance(msg, URLMsg):
        raise library.CELFunctionError(f"no such overload: {value_type_name(msg)} is not a URL")
    return str(msg.value)


def attribute_value(value: AttributeValue) -> Any:
    if isinstance(value, Version):
        return semver_value(library.parse_semver(value.text))
    if isinstance(value, tuple):
        return [attribute_value(v) for v in value]
    return value
