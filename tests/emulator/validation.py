"""Write validation: strict OpenAPI schemas (kubernetes-validate) plus the semantic checks the
schemas miss, on raw JSON.

* :class:`SchemaValidators` builds one ``Draft202012Validator`` per kind and caches it (a fresh
  ``kubernetes_validate.validate()`` call costs 5-12 ms, a cached validator well under 1 ms).
  A kind without a schema for the configured Kubernetes version raises
  :class:`SchemaMissingError` at first use: a missing schema is a failure, never a pass.
* Schema violations map to what the API server answers: an unknown field or a wrong JSON type
  is a 400 BadRequest (strict decoding), a missing required field or a bad enum value a 422
  Invalid with ``details.causes``.
* :func:`semantic_errors` holds the checks the schema cannot express: object names, label keys
  and values, quantities (400, as upstream's decoder answers, with the field named), DNS names
  in DRA objects, exactly one node-selection field, device and attribute limits, one value type
  per attribute, unique device names within a slice, references between requests,
  constraints and config, claim status rules.

Functions are pure; validators are safe to share between threads. :func:`stored_expressions`
validates the writes made inside it (in the calling thread) as the API server validates CEL
expressions it has *stored* before: not again (an older server, an older estimator, no cost
limit yet, wrote them; the current one keeps serving them).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
import json
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Final

import jsonschema  # type: ignore[import-untyped]
import referencing
import referencing.jsonschema

from driver.api.errors import QuantityError
from driver.api.quantity import Quantity
from kubeapi import codec
from tests.emulator.errors import ApiStatusError, FieldError, bad_request, invalid, invalid_patch
from tests.emulator.kinds import Kind
from tests.emulator.schema import Issue, Normalize, compile_normalizer, compile_schema, issues

DEFAULT_SCHEMA_VERSION: Final = "1.37"


class SchemaMissingError(RuntimeError):
    """kubernetes-validate has no strict schema for a kind at the configured version."""


def _schema_dir(version: str) -> Path:
    root = Path(str(resources.files("kubernetes_validate") / "kubernetes-json-schema"))
    wanted = version.removeprefix("v")
    candidates = sorted(p for p in root.glob(f"v{wanted}.*-local-strict") if p.is_dir())
    if not candidates:
        available = sorted(p.name for p in root.glob("v*-local-strict"))
        raise SchemaMissingError(
            f"kubernetes-validate has no strict schemas for Kubernetes {version}; "
            f"available: {', '.join(available)}"
        )
    return candidates[-1]


def _schema_file_name(kind: Kind) -> str:
    group = kind.group.split(".", 1)[0]
    suffix = f"{group}-{kind.version}" if group else kind.version
    return f"{kind.kind.lower()}-{suffix}.json"


class SchemaValidators:
    """One cached, thread-safe strict-schema validator per (apiVersion, kind).

    ``engine="compiled"`` (default) uses :mod:`tests.emulator.schema`; ``engine="jsonschema"``
    validates the same kubernetes-validate schemas with ``jsonschema`` (slower; the suite
    checks that both agree).
    """

    def __init__(self, version: str = DEFAULT_SCHEMA_VERSION, *, engine: str = "compiled") -> None:
        if engine not in {"compiled", "jsonschema"}:
            raise ValueError(f"unknown schema engine {engine!r}")
        self.version = version
        self.engine = engine
        self._dir = _schema_dir(version)
        self._lock = threading.Lock()
        self._definitions: dict[str, Any] | None = None
        self._registry: referencing.Registry[Any] | None = None
        self._validators: dict[tuple[str, str], Callable[[Any], list[Issue]]] = {}
        self._normalizers: dict[tuple[str, str], Normalize] = {}

    def _load(self, name: str) -> Any:
        path = self._dir / name
        if not path.exists():
            raise SchemaMissingError(
                f"kubernetes-validate has no schema {path.name} in {self._dir}"
            )
        return json.loads(path.read_text())

    def validator(
        self, api_version: str, kind_name: str, file_name: str
    ) -> Callable[[Any], list[Issue]]:
        """The cached validator for one kind: object -> schema issues (empty when valid)."""
        key = (api_version, kind_name)
        found = self._validators.get(key)
        if found is not None:
            return found
        with self._lock:
            if self._definitions is None:
                self._definitions = self._load("_definitions.json")
            schema = self._load(file_name)
            built: Callable[[Any], list[Issue]]
            if self.engine == "compiled":
                compiled = compile_schema(schema, self._definitions["$defs"])
                built = functools.partial(issues, compiled)
            else:
                if self._registry is None:
                    definitions = referencing.Resource.from_contents(self._definitions)
                    self._registry = definitions @ referencing.Registry()
                registry = referencing.Resource.from_contents(schema) @ self._registry
                reference = jsonschema.Draft202012Validator(schema, registry=registry)
                built = functools.partial(_jsonschema_issues, reference)
            self._validators[key] = built
            return built

    def normalize(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        """Re-encode Time/MicroTime fields canonically (RFC 3339 UTC; MicroTime with
        microseconds), as the API server does; an unparseable time is a 400."""
        key = (kind.api_version, kind.kind)
        normalizer = self._normalizers.get(key)
        if normalizer is None:
            with self._lock:
                if self._definitions is None:
                    self._definitions = self._load("_definitions.json")
                schema = self._load(_schema_file_name(kind))
                normalizer = compile_normalizer(schema, self._definitions["$defs"])
                self._normalizers[key] = normalizer
        found: list[Issue] = []
        out = normalizer(obj, (), found)
        if found:
            raise_for_issues(kind, obj, found)
        assert isinstance(out, dict)
        return out

    def for_kind(self, kind: Kind) -> Callable[[Any], list[Issue]]:
        return self.validator(kind.api_version, kind.kind, _schema_file_name(kind))

    def issues(self, kind: Kind, obj: Mapping[str, Any]) -> list[Issue]:
        return self.for_kind(kind)(obj)

    def check(self, kind: Kind, obj: Mapping[str, Any]) -> None:
        """Raise the API server's error for the schema violations found (400 or 422)."""
        found = self.for_kind(kind)(obj)
        if found:
            raise_for_issues(kind, obj, found)

    def check_patched(self, kind: Kind, obj: Mapping[str, Any], *, strict: bool) -> None:
        """A patched object must decode: a wrong type, or under ``Strict`` an unknown field, is
        the patch handler's 422 on the field ``patch`` (apiserver ``handlers/patch.go``), not
        the 400 a create or update with the same body gets."""
        found = self.for_kind(kind)(obj)
        broken = [i for i in found if i.kind in {"type", "time"}]
        unknown = [i for i in found if i.kind == "unknown"] if strict else []
        if not broken and not unknown:
            return
        patched = json.dumps(obj, separators=(",", ":"))
        if broken:  # a non-strict decoding error trumps the unknown fields
            raise invalid_patch(patched, _describe(broken[0]))
        fields = ", ".join(f'unknown field "{_path(i.path)}"' for i in unknown)
        raise invalid_patch(patched, f"strict decoding error: {fields}")

    def check_raw(self, api_version: str, kind_name: str, file_name: str, obj: Any) -> list[str]:
        """Schema messages for an auxiliary body (Binding): empty when valid."""
        return [
            _describe(issue) for issue in self.validator(api_version, kind_name, file_name)(obj)
        ]


def _path(parts: Any) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


_GO_TYPES: Final = {
    "string": "string",
    "integer": "int64",
    "number": "float64",
    "boolean": "bool",
    "object": "object",
    "array": "array",
}


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def _describe(issue: Issue) -> str:
    path = _path(issue.path) or "."
    if issue.kind == "unknown":
        return f'strict decoding error: unknown field "{path}"'
    if issue.kind == "type":
        wanted = "/".join(_GO_TYPES.get(str(t), str(t)) for t in issue.expected if t != "null")
        return (
            f"json: cannot unmarshal {_json_type(issue.instance)} into Go struct field "
            f"{path} of type {wanted or 'value'}"
        )
    if issue.kind == "time":
        return (
            f'{path}: parsing time "{issue.instance}" as "2006-01-02T15:04:05Z07:00": '
            "not an RFC 3339 time with a zone"
        )
    if issue.kind == "required":
        return f"{path}: Required value"
    if issue.kind == "enum":
        return f"{path}: Unsupported value: {json.dumps(issue.instance)}"
    return f"{path}: Invalid value: {json.dumps(issue.instance)}"


def raise_for_issues(kind: Kind, obj: Mapping[str, Any], found: list[Issue]) -> None:
    """Unknown fields and wrong types are decoding errors (400); the rest field errors (422)."""
    decode = sorted({_describe(i) for i in found if i.kind in {"unknown", "type", "time"}})
    if decode:
        raise bad_request(
            f'{kind.kind} in version "{kind.version}" cannot be handled as a {kind.kind}: '
            + "; ".join(decode)
        )
    fields: list[FieldError] = []
    for issue in found:
        path = _path(issue.path)
        if issue.kind == "required":
            fields.append(FieldError(path, "Required value", ""))
        elif issue.kind == "enum":
            supported = ", ".join(f'"{v}"' for v in issue.expected)
            fields.append(
                FieldError(
                    path, "Unsupported value", f"supported values: {supported}", issue.instance
                )
            )
        else:
            fields.append(FieldError(path, "Invalid value", "", issue.instance))
    name = str((obj.get("metadata") or {}).get("name") or "")
    raise invalid(kind, name, fields)


def _jsonschema_issues(validator: Any, obj: Any) -> list[Issue]:
    out: list[Issue] = []
    for error in validator.iter_errors(obj):
        _from_jsonschema(error, out)
    return out


def _from_jsonschema(error: Any, out: list[Issue]) -> None:
    path = tuple(error.absolute_path)
    keyword = error.validator
    if keyword == "additionalProperties":
        allowed = set((error.schema.get("properties") or {}).keys())
        out.extend(
            Issue("unknown", (*path, extra), error.instance[extra])
            for extra in sorted(set(error.instance) - allowed)
        )
    elif keyword == "type":
        wanted = error.validator_value
        out.append(
            Issue(
                "type",
                path,
                error.instance,
                tuple(wanted) if isinstance(wanted, list) else (wanted,),
            )
        )
    elif keyword in {"oneOf", "anyOf"}:
        types = tuple(
            t
            for alt in error.validator_value
            for t in (alt.get("type") if isinstance(alt.get("type"), list) else [alt.get("type")])
        )
        out.append(Issue("type", path, error.instance, types))
    elif keyword == "required":
        present = set(error.instance) if isinstance(error.instance, dict) else set()
        out.extend(
            Issue("required", (*path, m), None) for m in error.validator_value if m not in present
        )
    elif keyword == "enum":
        out.append(Issue("enum", path, error.instance, tuple(error.validator_value)))
    else:
        out.append(Issue("invalid", path, error.instance))


# --------------------------------------------------------------------------- semantic checks

_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_C_IDENTIFIER: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_NAME: Final = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE: Final = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SEMVER: Final = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
_QUANTITY_HINT: Final = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)

DNS_LABEL_MSG: Final = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
DNS_SUBDOMAIN_MSG: Final = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)

MAX_DEVICES: Final = 128
MAX_DEVICES_ADVANCED: Final = 64
MAX_ATTRIBUTES_AND_CAPACITIES: Final = 32
MAX_ATTRIBUTE_VALUES: Final = 48
MAX_COUNTER_SETS: Final = 8
MAX_COUNTERS: Final = 32
MAX_TAINTS: Final = 16
MAX_REQUESTS: Final = 32
MAX_SUBREQUESTS: Final = 8
MAX_SELECTORS: Final = 32
MAX_CONFIGS: Final = 32
MAX_RESERVED_FOR: Final = 256
MAX_RESULTS: Final = 32
DRIVER_NAME_MAX: Final = 63
POOL_NAME_MAX: Final = 253
_ATTRIBUTE_TYPES: Final = (
    "int",
    "bool",
    "string",
    "version",
    "ints",
    "bools",
    "strings",
    "versions",
)


class _Errors:
    """Collects field errors and quantity (decode) errors."""

    def __init__(self) -> None:
        self.fields: list[FieldError] = []
        self.decode: list[str] = []

    def add(self, path: str, kind: str, detail: str, value: Any = None) -> None:
        self.fields.append(FieldError(path, kind, detail, value))

    def dns_label(self, path: str, value: Any, *, required: bool = True) -> None:
        if value in (None, ""):
            if required:
                self.add(path, "Required value", "")
            return
        if not isinstance(value, str) or len(value) > 63 or not _DNS_LABEL.match(value):
            detail = (
                "must be no more than 63 characters"
                if isinstance(value, str) and len(value) > 63
                else DNS_LABEL_MSG
            )
            self.add(path, "Invalid value", detail, value)

    def dns_subdomain(
        self, path: str, value: Any, *, max_len: int = 253, required: bool = True
    ) -> None:
        if value in (None, ""):
            if required:
                self.add(path, "Required value", "")
            return
        if not isinstance(value, str) or not _DNS_SUBDOMAIN.match(value):
            self.add(path, "Invalid value", DNS_SUBDOMAIN_MSG, value)
        elif len(value) > max_len:
            self.add(path, "Too long", f"may not be more than {max_len} bytes", value)

    def quantity(self, path: str, value: Any) -> None:
        if value is None:
            return
        try:
            Quantity.parse(str(value))
        except QuantityError:
            self.decode.append(f"{path}: {_QUANTITY_HINT}")

    def too_many(self, path: str, items: Any, limit: int) -> bool:
        if isinstance(items, list | dict) and len(items) > limit:
            self.add(path, "Too many", f"{len(items)}: must have at most {limit} items")
            return True
        return False

    def raise_if_any(self, kind: Kind, name: str) -> None:
        if self.decode:
            raise ApiStatusError(
                400,
                "BadRequest",
                f'{kind.kind} in version "{kind.version}" cannot be handled as a {kind.kind}: '
                + "; ".join(self.decode),
                {
                    "causes": [
                        {
                            "reason": "FieldValueInvalid",
                            "message": d.split(": ", 1)[1],
                            "field": d.split(": ", 1)[0],
                        }
                        for d in self.decode
                    ]
                },
            )
        if self.fields:
            raise invalid(kind, name, self.fields)


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _qualified_name(errs: _Errors, path: str, name: str, *, fully: bool = False) -> None:
    domain, sep, ident = name.rpartition("/")
    if not sep:
        if fully:
            errs.add(
                path,
                "Invalid value",
                "a fully qualified name must be a domain and a name separated by a slash",
                name,
            )
            return
        ident = name
    elif not domain or len(domain) > 63 or not _DNS_SUBDOMAIN.match(domain):
        errs.add(
            path,
            "Invalid value",
            "the domain must be a DNS subdomain of at most 63 characters",
            name,
        )
    if not _C_IDENTIFIER.match(ident) or len(ident) > 32:
        errs.add(
            path,
            "Invalid value",
            "a C identifier of at most 32 characters is required after the domain",
            name,
        )


def _metadata(errs: _Errors, kind: Kind, meta: Mapping[str, Any]) -> None:
    name = meta.get("name")
    if isinstance(name, str) and name:
        if kind.name_is_path_segment:
            if name in {".", ".."} or "/" in name or "%" in name:
                errs.add(
                    "metadata.name",
                    "Invalid value",
                    "may not contain '/' or '%' and may not be '.' or '..'",
                    name,
                )
        elif kind.name_is_dns_label:
            errs.dns_label("metadata.name", name)
        else:
            errs.dns_subdomain("metadata.name", name)
    for key, value in _map(meta.get("labels")).items():
        _label_key(errs, "metadata.labels", key)
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            errs.add(
                "metadata.labels",
                "Invalid value",
                "a valid label must be an empty string or consist of alphanumeric characters, "
                "'-', '_' or '.', and must start and end with an alphanumeric character",
                value,
            )
    for key in _map(meta.get("annotations")):
        _label_key(errs, "metadata.annotations", key)
    size = sum(len(k) + len(str(v)) for k, v in _map(meta.get("annotations")).items())
    if size > 256 * 1024:
        errs.add("metadata.annotations", "Too long", "must have at most 262144 bytes")
    finalizers = _items(meta.get("finalizers"))
    for i, fin in enumerate(finalizers):
        if not isinstance(fin, str) or (
            "/" not in fin and fin not in {"kubernetes", "orphan", "foregroundDeletion"}
        ):
            errs.add(
                f"metadata.finalizers[{i}]",
                "Invalid value",
                "name is neither a standard finalizer name nor is it fully qualified",
                fin,
            )


def _label_key(errs: _Errors, path: str, key: str) -> None:
    prefix, sep, name = key.rpartition("/")
    ok = bool(_LABEL_NAME.match(name)) and len(name) <= 63
    if sep:
        ok = ok and bool(prefix) and len(prefix) <= 253 and bool(_DNS_SUBDOMAIN.match(prefix))
    if not ok:
        errs.add(
            path,
            "Invalid value",
            "name part must consist of alphanumeric characters, '-', '_' "
            "or '.', and must start and end with an alphanumeric character, with an optional DNS "
            "subdomain prefix and '/'",
            key,
        )


def _node_selector(errs: _Errors, path: str, selector: Any) -> None:
    terms = _items(_map(selector).get("nodeSelectorTerms"))
    if len(terms) != 1:
        errs.add(
            f"{path}.nodeSelectorTerms",
            "Invalid value",
            "must have exactly one node selector term",
            len(terms),
        )


def _device(errs: _Errors, path: str, device: Mapping[str, Any], per_device_nodes: bool) -> None:
    errs.dns_label(f"{path}.name", device.get("name"))
    attributes = _map(device.get("attributes"))
    capacity = _map(device.get("capacity"))
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        errs.add(
            path,
            "Too many",
            f"{len(attributes) + len(capacity)}: the total number of attributes "
            f"and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}",
        )
    values = 0
    for name, attr in attributes.items():
        apath = f"{path}.attributes[{name}]"
        _qualified_name(errs, apath, name)
        set_types = [t for t in _ATTRIBUTE_TYPES if _map(attr).get(t) is not None]
        if len(set_types) != 1:
            errs.add(apath, "Invalid value", "exactly one value must be specified", attr)
            continue
        kind_ = set_types[0]
        value = attr[kind_]
        entries = value if kind_.endswith("s") and isinstance(value, list) else [value]
        if kind_.endswith("s") and not entries:
            errs.add(f"{apath}.{kind_}", "Required value", "a list attribute must not be empty")
        values += len(entries)
        for entry in entries:
            if kind_.startswith("string") and isinstance(entry, str) and len(entry) > 64:
                errs.add(f"{apath}.{kind_}", "Too long", "may not be more than 64 bytes", entry)
            if kind_.startswith("version"):
                if not isinstance(entry, str) or not _SEMVER.match(entry):
                    errs.add(
                        f"{apath}.{kind_}",
                        "Invalid value",
                        "must be a string compatible with semver.org spec 2.0.0",
                        entry,
                    )
                elif len(entry) > 64:
                    errs.add(f"{apath}.{kind_}", "Too long", "may not be more than 64 bytes", entry)
    if values + len(capacity) > MAX_ATTRIBUTE_VALUES:
        errs.add(
            path, "Too many", f"a device may have at most {MAX_ATTRIBUTE_VALUES} attribute values"
        )
    for name, cap in capacity.items():
        cpath = f"{path}.capacity[{name}]"
        _qualified_name(errs, cpath, name)
        errs.quantity(f"{cpath}.value", _map(cap).get("value"))
        policy = _map(_map(cap).get("requestPolicy"))
        errs.quantity(f"{cpath}.requestPolicy.default", policy.get("default"))
        for i, v in enumerate(_items(policy.get("validValues"))):
            errs.quantity(f"{cpath}.requestPolicy.validValues[{i}]", v)
        for bound in ("min", "max", "step"):
            errs.quantity(
                f"{cpath}.requestPolicy.validRange.{bound}",
                _map(policy.get("validRange")).get(bound),
            )
        if policy.get("validValues") is not None and policy.get("validRange") is not None:
            errs.add(
                f"{cpath}.requestPolicy", "Invalid value", "exactly one policy can be specified", ""
            )
        if policy:
            _request_policy(errs, cpath, _map(cap).get("value"), policy, device)
    consumes = _items(device.get("consumesCounters"))
    errs.too_many(f"{path}.consumesCounters", consumes, 2)
    for i, consumption in enumerate(consumes):
        errs.dns_label(
            f"{path}.consumesCounters[{i}].counterSet", _map(consumption).get("counterSet")
        )
        counters = _map(_map(consumption).get("counters"))
        errs.too_many(f"{path}.consumesCounters[{i}].counters", counters, MAX_COUNTERS)
        for cname, counter in counters.items():
            errs.quantity(
                f"{path}.consumesCounters[{i}].counters[{cname}].value", _map(counter).get("value")
            )
    taints = _items(device.get("taints"))
    errs.too_many(f"{path}.taints", taints, MAX_TAINTS)
    for i, taint in enumerate(taints):
        effect = _map(taint).get("effect")
        if effect not in {"None", "NoSchedule", "NoExecute"}:
            errs.add(
                f"{path}.taints[{i}].effect",
                "Unsupported value",
                'supported values: "NoExecute", "NoSchedule", "None"',
                effect,
            )
    for field in ("bindingConditions", "bindingFailureConditions"):
        errs.too_many(f"{path}.{field}", device.get(field), 4)
    node_fields = [
        f for f in ("nodeName", "nodeSelector", "allNodes") if device.get(f) not in (None, False)
    ]
    if node_fields and not per_device_nodes:
        errs.add(
            f"{path}.{node_fields[0]}",
            "Forbidden",
            "only allowed when perDeviceNodeSelection is true",
        )
    if per_device_nodes and len(node_fields) != 1:
        errs.add(
            path,
            "Invalid value",
            "exactly one of `nodeName`, `nodeSelector`, `allNodes` must be "
            "set when `perDeviceNodeSelection` is true",
            node_fields,
        )
    if device.get("nodeSelector") is not None:
        _node_selector(errs, f"{path}.nodeSelector", device.get("nodeSelector"))


def _q(value: Any) -> Quantity | None:
    try:
        return Quantity.parse(str(value)) if value is not None else None
    except QuantityError:
        return None  # reported by the quantity check


def _request_policy(
    errs: _Errors, cpath: str, total: Any, policy: Mapping[str, Any], device: Mapping[str, Any]
) -> None:
    """Consumable-capacity request policy rules (DRAConsumableCapacity)."""
    ppath = f"{cpath}.requestPolicy"
    if device.get("allowMultipleAllocations") is not True:
        errs.add(ppath, "Forbidden", "only allowed when `allowMultipleAllocations` is true")
    value, default = _q(total), _q(policy.get("default"))
    valid = [_q(v) for v in _items(policy.get("validValues"))]
    if policy.get("validValues") is not None:
        if errs.too_many(f"{ppath}.validValues", policy.get("validValues"), 10):
            return
        known = [v for v in valid if v is not None]
        if any(b <= a for a, b in itertools.pairwise(known)):
            errs.add(
                f"{ppath}.validValues", "Invalid value", "must be sorted in ascending order", ""
            )
        if default is not None and default not in known:
            errs.add(
                f"{ppath}.default",
                "Invalid value",
                "must be one of the validValues",
                policy.get("default"),
            )
        if value is not None and any(v > value for v in known):
            errs.add(
                f"{ppath}.validValues", "Invalid value", "may not exceed the capacity value", ""
            )
    valid_range = policy.get("validRange")
    if isinstance(valid_range, dict):
        low, high = _q(valid_range.get("min")), _q(valid_range.get("max"))
        if valid_range.get("min") is None:
            errs.add(f"{ppath}.validRange.min", "Required value", "")
        if low is not None and value is not None and low > value:
            errs.add(
                f"{ppath}.validRange.min",
                "Invalid value",
                "may not exceed the capacity value",
                valid_range.get("min"),
            )
        if high is not None and value is not None and high > value:
            errs.add(
                f"{ppath}.validRange.max",
                "Invalid value",
                "may not exceed the capacity value",
                valid_range.get("max"),
            )
        if low is not None and high is not None and low > high:
            errs.add(
                f"{ppath}.validRange.max",
                "Invalid value",
                "must be greater than or equal to min",
                valid_range.get("max"),
            )
        if default is not None and low is not None and default < low:
            errs.add(
                f"{ppath}.default",
                "Invalid value",
                "must be greater than or equal to validRange.min",
                policy.get("default"),
            )
    if default is not None and value is not None and default > value:
        errs.add(
            f"{ppath}.default",
            "Invalid value",
            "may not exceed the capacity value",
            policy.get("default"),
        )


def _uses_advanced(device: Mapping[str, Any]) -> bool:
    if device.get("taints") or device.get("consumesCounters"):
        return True
    return any(
        any(_map(a).get(t) is not None for t in ("ints", "bools", "strings", "versions"))
        for a in _map(device.get("attributes")).values()
    )


def resource_slice_errors(errs: _Errors, obj: Mapping[str, Any]) -> None:
    spec = _map(obj.get("spec"))
    driver = spec.get("driver")
    errs.dns_subdomain("spec.driver", driver, max_len=DRIVER_NAME_MAX)
    if isinstance(driver, str) and driver != driver.lower():
        errs.add("spec.driver", "Invalid value", "must be lowercase", driver)
    pool = _map(spec.get("pool"))
    pool_name = pool.get("name")
    if not pool_name:
        errs.add("spec.pool.name", "Required value", "")
    elif isinstance(pool_name, str):
        if len(pool_name) > POOL_NAME_MAX:
            errs.add(
                "spec.pool.name",
                "Too long",
                f"may not be more than {POOL_NAME_MAX} bytes",
                pool_name,
            )
        for part in pool_name.split("/"):
            if not _DNS_SUBDOMAIN.match(part):
                errs.add("spec.pool.name", "Invalid value", DNS_SUBDOMAIN_MSG, pool_name)
                break
    if isinstance(pool.get("generation"), int) and pool["generation"] < 0:
        errs.add(
            "spec.pool.generation",
            "Invalid value",
            "must be greater than or equal to 0",
            pool["generation"],
        )
    count = pool.get("resourceSliceCount")
    if isinstance(count, int) and count <= 0:
        errs.add(
            "spec.pool.resourceSliceCount", "Invalid value", "must be greater than zero", count
        )
    selection = [
        f
        for f in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
        if spec.get(f) not in (None, False, "")
    ]
    if not selection:
        errs.add(
            "spec",
            "Required value",
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` "
            "is required",
        )
    elif len(selection) > 1:
        errs.add(
            "spec",
            "Invalid value",
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is "
            "required, but multiple fields are set",
            "{" + ", ".join(f"`{f}`" for f in selection) + "}",
        )
    if spec.get("nodeName"):
        errs.dns_subdomain("spec.nodeName", spec.get("nodeName"))
    if spec.get("nodeSelector") is not None:
        _node_selector(errs, "spec.nodeSelector", spec.get("nodeSelector"))
    devices = _items(spec.get("devices"))
    counters = _items(spec.get("sharedCounters"))
    if devices and counters:
        errs.add(
            "spec", "Invalid value", "only one of `devices` or `sharedCounters` can be set", ""
        )
    advanced = any(_uses_advanced(_map(d)) for d in devices)
    limit = MAX_DEVICES_ADVANCED if advanced else MAX_DEVICES
    if len(devices) > limit:
        detail = f"{len(devices)}: must have at most {limit} items"
        if advanced:
            detail += " when any device uses taints, consumesCounters or list-type attributes"
        errs.add("spec.devices", "Too many", detail)
    seen: set[str] = set()
    per_device = bool(spec.get("perDeviceNodeSelection"))
    for i, device in enumerate(devices):
        name = _map(device).get("name")
        if isinstance(name, str):
            if name in seen:
                errs.add(f"spec.devices[{i}]", "Duplicate value", "", name)
            seen.add(name)
        _device(errs, f"spec.devices[{i}]", _map(device), per_device)
    errs.too_many("spec.sharedCounters", counters, MAX_COUNTER_SETS)
    set_names: set[str] = set()
    for i, counter_set in enumerate(counters):
        cs_name = _map(counter_set).get("name")
        errs.dns_label(f"spec.sharedCounters[{i}].name", cs_name)
        if isinstance(cs_name, str):
            if cs_name in set_names:
                errs.add(f"spec.sharedCounters[{i}]", "Duplicate value", "", cs_name)
            set_names.add(cs_name)
        values = _map(_map(counter_set).get("counters"))
        errs.too_many(f"spec.sharedCounters[{i}].counters", values, MAX_COUNTERS)
        for cname, counter in values.items():
            errs.dns_label(f"spec.sharedCounters[{i}].counters[{cname}]", cname)
            errs.quantity(
                f"spec.sharedCounters[{i}].counters[{cname}].value", _map(counter).get("value")
            )


def _selectors(errs: _Errors, path: str, selectors: Any) -> None:
    errs.too_many(path, selectors, MAX_SELECTORS)
    for i, selector in enumerate(_items(selectors)):
        cel = _map(_map(selector).get("cel"))
        expression = cel.get("expression")
        if not expression:
            errs.add(f"{path}[{i}].cel.expression", "Required value", "")
        elif isinstance(expression, str):
            problem = _cel_problem(expression)
            if problem == _TOO_COMPLEX:
                errs.add(f"{path}[{i}].cel.expression", "Forbidden", problem)
            elif problem:
                errs.add(f"{path}[{i}].cel.expression", "Invalid value", problem, expression)


# The API server's refusal of a selector whose estimated cost exceeds the limit
# (pkg/apis/resource/validation: MaxCost > CELSelectorExpressionMaxCost).
_TOO_COMPLEX = "too complex, exceeds cost limit"


_STORED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "emulator_stored_expressions", default=False
)


@contextlib.contextmanager
def stored_expressions() -> Iterator[None]:
    """Writes in this block carry CEL expressions the API server stored earlier: they are not
    checked again (pkg/apis/resource/validation ``validateCELExpression``: "If a CEL
    expression is stored, it must have been valid at the time it was stored"). How a selector
    that today's cost estimate refuses still reaches a scheduler: a DeviceClass or a claim
    written by an older API server."""
    token = _STORED.set(True)
    try:
        yield
    finally:
        _STORED.reset(token)


def _cel_problem(expression: str) -> str | None:
    """Why the API server would refuse a DRA CEL selector (syntax, types, result type,
    length, upstream's compile-time rules, the estimated cost), via the project's CEL
    environment (``driver.cel.engine``: upstream's declarations and cost estimate)."""
    if _STORED.get():
        return None
    from driver.api.errors import CELCompileError
    from driver.cel.engine import COST_LIMIT, compile_selector

    try:
        selector = compile_selector(expression)
    except CELCompileError as exc:
        return str(exc)
    if selector.max_cost > COST_LIMIT:
        return _TOO_COMPLEX
    return None


def _opaque(errs: _Errors, path: str, opaque: Any) -> None:
    if opaque is None:
        errs.add(path, "Required value", "")
        return
    errs.dns_subdomain(f"{path}.driver", _map(opaque).get("driver"), max_len=DRIVER_NAME_MAX)
    if len(codec.dumps(_map(opaque).get("parameters"))) > 10 * 1024:
        errs.add(f"{path}.parameters", "Too long", "must have at most 10240 bytes")


def _exact(errs: _Errors, path: str, req: Mapping[str, Any], *, sub: bool = False) -> None:
    errs.dns_subdomain(f"{path}.deviceClassName", req.get("deviceClassName"))
    _selectors(errs, f"{path}.selectors", req.get("selectors"))
    mode = req.get("allocationMode", "ExactCount")
    if mode not in {"ExactCount", "All"}:
        errs.add(
            f"{path}.allocationMode",
            "Unsupported value",
            'supported values: "All", "ExactCount"',
            mode,
        )
    count = req.get("count")
    if mode == "ExactCount" and isinstance(count, int) and count <= 0:
        errs.add(f"{path}.count", "Invalid value", "must be greater than zero", count)
    if mode == "All" and count not in (None, 0):
        errs.add(
            f"{path}.count",
            "Invalid value",
            "must not be specified when allocationMode is 'All'",
            count,
        )
    errs.too_many(f"{path}.tolerations", req.get("tolerations"), MAX_TAINTS)
    for name, value in _map(_map(req.get("capacity")).get("requests")).items():
        errs.quantity(f"{path}.capacity.requests[{name}]", value)
    if sub and req.get("adminAccess") is not None:
        errs.add(f"{path}.adminAccess", "Forbidden", "not supported in a subrequest")


def claim_spec_errors(errs: _Errors, path: str, spec: Mapping[str, Any]) -> set[str]:
    """Check a ResourceClaimSpec; returns the request names it defines (``r`` and ``r/s``)."""
    devices = _map(spec.get("devices"))
    requests = _items(devices.get("requests"))
    errs.too_many(f"{path}.devices.requests", requests, MAX_REQUESTS)
    names: set[str] = set()
    for i, raw_req in enumerate(requests):
        rpath = f"{path}.devices.requests[{i}]"
        req = _map(raw_req)
        name = req.get("name")
        errs.dns_label(f"{rpath}.name", name)
        if isinstance(name, str):
            if name in names:
                errs.add(rpath, "Duplicate value", "", name)
            names.add(name)
        exactly, first = req.get("exactly"), req.get("firstAvailable")
        if (exactly is None) == (first is None):
            errs.add(
                rpath,
                "Invalid value",
                "exactly one of `exactly` or `firstAvailable` is required",
                "",
            )
        if exactly is not None:
            _exact(errs, f"{rpath}.exactly", _map(exactly))
        if first is not None:
            subs = _items(first)
            if not subs:
                errs.add(f"{rpath}.firstAvailable", "Required value", "")
            errs.too_many(f"{rpath}.firstAvailable", subs, MAX_SUBREQUESTS)
            sub_names: set[str] = set()
            for j, sub in enumerate(subs):
                sname = _map(sub).get("name")
                errs.dns_label(f"{rpath}.firstAvailable[{j}].name", sname)
                if isinstance(sname, str):
                    if sname in sub_names:
                        errs.add(f"{rpath}.firstAvailable[{j}]", "Duplicate value", "", sname)
                    sub_names.add(sname)
                    names.add(f"{name}/{sname}")
                _exact(errs, f"{rpath}.firstAvailable[{j}]", _map(sub), sub=True)
    constraints = _items(devices.get("constraints"))
    errs.too_many(f"{path}.devices.constraints", constraints, MAX_REQUESTS)
    for i, raw_constraint in enumerate(constraints):
        cpath = f"{path}.devices.constraints[{i}]"
        constraint = _map(raw_constraint)
        kinds = [k for k in ("matchAttribute", "distinctAttribute") if constraint.get(k)]
        if len(kinds) != 1:
            errs.add(
                cpath,
                "Invalid value",
                "exactly one of `matchAttribute` or `distinctAttribute` is required",
                "",
            )
        for k in kinds:
            _qualified_name(errs, f"{cpath}.{k}", str(constraint[k]), fully=True)
        for j, ref in enumerate(_items(constraint.get("requests"))):
            if ref not in names:
                errs.add(
                    f"{cpath}.requests[{j}]",
                    "Invalid value",
                    "must be the name of a request in the claim or the name of a request and "
                    "a subrequest separated by '/'",
                    ref,
                )
    configs = _items(devices.get("config"))
    errs.too_many(f"{path}.devices.config", configs, MAX_CONFIGS)
    for i, config in enumerate(configs):
        cpath = f"{path}.devices.config[{i}]"
        _opaque(errs, f"{cpath}.opaque", _map(config).get("opaque"))
        for j, ref in enumerate(_items(_map(config).get("requests"))):
            if ref not in names:
                errs.add(
                    f"{cpath}.requests[{j}]",
                    "Invalid value",
                    "must be the name of a request in the claim or the name of a request and "
                    "a subrequest separated by '/'",
                    ref,
                )
    return names


def claim_status_errors(errs: _Errors, obj: Mapping[str, Any], names: set[str]) -> None:
    status = _map(obj.get("status"))
    allocation = status.get("allocation")
    results = _items(_map(_map(allocation).get("devices")).get("results"))
    errs.too_many("status.allocation.devices.results", results, MAX_RESULTS)
    allocated: set[tuple[Any, Any, Any]] = set()
    for i, raw_result in enumerate(results):
        rpath = f"status.allocation.devices.results[{i}]"
        result = _map(raw_result)
        if result.get("request") not in names:
            errs.add(
                f"{rpath}.request",
                "Invalid value",
                "must be the name of a request in the claim or the name of a request and a "
                "subrequest separated by '/'",
                result.get("request"),
            )
        errs.dns_subdomain(f"{rpath}.driver", result.get("driver"), max_len=DRIVER_NAME_MAX)
        if not result.get("pool"):
            errs.add(f"{rpath}.pool", "Required value", "")
        errs.dns_label(f"{rpath}.device", result.get("device"))
        for cname, value in _map(result.get("consumedCapacity")).items():
            errs.quantity(f"{rpath}.consumedCapacity[{cname}]", value)
        allocated.add((result.get("driver"), result.get("pool"), result.get("device")))
    reserved = _items(status.get("reservedFor"))
    if reserved and allocation is None:
        errs.add(
            "status.reservedFor", "Forbidden", "may not be specified when `allocated` is not set"
        )
    errs.too_many("status.reservedFor", reserved, MAX_RESERVED_FOR)
    uids: set[str] = set()
    for i, ref in enumerate(reserved):
        uid = _map(ref).get("uid")
        if not uid:
            errs.add(f"status.reservedFor[{i}].uid", "Required value", "")
        elif uid in uids:
            errs.add(f"status.reservedFor[{i}]", "Duplicate value", "", uid)
        uids.add(str(uid))
        if not _map(ref).get("resource"):
            errs.add(f"status.reservedFor[{i}].resource", "Required value", "")
        if not _map(ref).get("name"):
            errs.add(f"status.reservedFor[{i}].name", "Required value", "")
    for i, raw_device in enumerate(_items(status.get("devices"))):
        device = _map(raw_device)
        key = (device.get("driver"), device.get("pool"), device.get("device"))
        if key not in allocated:
            errs.add(
                f"status.devices[{i}]",
                "Invalid value",
                "must be an allocated device in the claim",
                "/".join(str(k) for k in key),
            )
        errs.too_many(f"status.devices[{i}].conditions", device.get("conditions"), 8)


def pod_errors(errs: _Errors, obj: Mapping[str, Any]) -> None:
    spec = _map(obj.get("spec"))
    claim_names: set[str] = set()
    for i, raw_claim in enumerate(_items(spec.get("resourceClaims"))):
        claim = _map(raw_claim)
        errs.dns_label(f"spec.resourceClaims[{i}].name", claim.get("name"))
        if claim.get("name") in claim_names:
            errs.add(f"spec.resourceClaims[{i}].name", "Duplicate value", "", claim.get("name"))
        claim_names.add(str(claim.get("name")))
        sources = [k for k in ("resourceClaimName", "resourceClaimTemplateName") if claim.get(k)]
        if len(sources) != 1:
            errs.add(
                f"spec.resourceClaims[{i}]",
                "Invalid value",
                "must specify one of: `resourceClaimName`, `resourceClaimTemplateName`",
                "",
            )
    if not _items(spec.get("containers")):
        errs.add("spec.containers", "Required value", "")
    names: set[str] = set()
    for group in ("initContainers", "containers"):
        for i, raw_container in enumerate(_items(spec.get(group))):
            container = _map(raw_container)
            cpath = f"spec.{group}[{i}]"
            errs.dns_label(f"{cpath}.name", container.get("name"))
            if not container.get("image"):
                errs.add(f"{cpath}.image", "Required value", "")
            if container.get("name") in names:
                errs.add(f"{cpath}.name", "Duplicate value", "", container.get("name"))
            names.add(str(container.get("name")))
            resources_ = _map(container.get("resources"))
            for section in ("requests", "limits"):
                for rname, value in _map(resources_.get(section)).items():
                    errs.quantity(f"{cpath}.resources.{section}[{rname}]", value)
            for j, ref in enumerate(_items(resources_.get("claims"))):
                if _map(ref).get("name") not in claim_names:
                    errs.add(
                        f"{cpath}.resources.claims[{j}].name",
                        "Not found",
                        "",
                        _map(ref).get("name"),
                    )
    if spec.get("nodeName"):
        errs.dns_subdomain("spec.nodeName", spec.get("nodeName"))


def node_errors(errs: _Errors, obj: Mapping[str, Any]) -> None:
    status = _map(obj.get("status"))
    for section in ("capacity", "allocatable"):
        for rname, value in _map(status.get(section)).items():
            errs.quantity(f"status.{section}[{rname}]", value)


def device_class_errors(errs: _Errors, obj: Mapping[str, Any]) -> None:
    spec = _map(obj.get("spec"))
    _selectors(errs, "spec.selectors", spec.get("selectors"))
    configs = _items(spec.get("config"))
    errs.too_many("spec.config", configs, MAX_CONFIGS)
    for i, config in enumerate(configs):
        _opaque(errs, f"spec.config[{i}].opaque", _map(config).get("opaque"))
    ext = spec.get("extendedResourceName")
    if ext is not None:
        domain, sep, name = str(ext).partition("/")
        if (
            not sep
            or not _DNS_SUBDOMAIN.match(domain)
            or not _LABEL_NAME.match(name)
            or domain.endswith("kubernetes.io")
        ):
            errs.add(
                "spec.extendedResourceName",
                "Invalid value",
                "must be a valid extended resource name",
                ext,
            )


def template_errors(errs: _Errors, obj: Mapping[str, Any]) -> None:
    spec = _map(obj.get("spec"))
    claim_spec_errors(errs, "spec.spec", _map(spec.get("spec")))
    meta = _map(spec.get("metadata"))
    for extra in sorted(set(meta) - {"labels", "annotations"}):
        errs.add(f"spec.metadata.{extra}", "Forbidden", "only labels and annotations may be set")


_PV_SOURCES: Final = (
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "csi",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "glusterfs",
    "hostPath",
    "iscsi",
    "local",
    "nfs",
    "photonPersistentDisk",
    "portworxVolume",
    "quobyte",
    "rbd",
    "scaleIO",
    "storageos",
    "vsphereVolume",
)


def claim_volume_errors(errs: _Errors, obj: Mapping[str, Any]) -> None:
    """A PersistentVolumeClaim: access modes and a storage request are required."""
    spec = _map(obj.get("spec"))
    if not _items(spec.get("accessModes")):
        errs.add("spec.accessModes", "Required value", "at least 1 access mode is required")
    requests = _map(_map(spec.get("resources")).get("requests"))
    if "storage" not in requests:
        errs.add("spec.resources[storage]", "Required value", "")
    for rname, value in requests.items():
        errs.quantity(f"spec.resources.requests[{rname}]", value)


def persistent_volume_errors(errs: _Errors, obj: Mapping[str, Any]) -> None:
    """A PersistentVolume: capacity, access modes and exactly one volume source; a local
    volume needs node affinity."""
    spec = _map(obj.get("spec"))
    capacity = _map(spec.get("capacity"))
    if "storage" not in capacity:
        errs.add("spec.capacity", "Required value", "")
    for rname, value in capacity.items():
        errs.quantity(f"spec.capacity[{rname}]", value)
    if not _items(spec.get("accessModes")):
        errs.add("spec.accessModes", "Required value", "")
    sources = [s for s in _PV_SOURCES if spec.get(s) is not None]
    if len(sources) != 1:
        errs.add(
            "spec",
            "Required value" if not sources else "Forbidden",
            "must specify a volume type"
            if not sources
            else "may not specify more than 1 volume type",
        )
    if spec.get("local") is not None and not _map(spec.get("nodeAffinity")).get("required"):
        errs.add("spec.nodeAffinity", "Required value", "Local volume requires node affinity")


def csi_storage_capacity_errors(errs: _Errors, obj: Mapping[str, Any]) -> None:
    for field_name in ("capacity", "maximumVolumeSize"):
        errs.quantity(field_name, obj.get(field_name))


def semantic_check(kind: Kind, obj: Mapping[str, Any]) -> None:
    """Raise the API server's 400/422 for what the schema does not catch."""
    errs = _Errors()
    _metadata(errs, kind, _map(obj.get("metadata")))
    if kind.kind == "ResourceSlice":
        resource_slice_errors(errs, obj)
    elif kind.kind == "ResourceClaim":
        names = claim_spec_errors(errs, "spec", _map(obj.get("spec")))
        claim_status_errors(errs, obj, names)
    elif kind.kind == "ResourceClaimTemplate":
        template_errors(errs, obj)
    elif kind.kind == "DeviceClass":
        device_class_errors(errs, obj)
    elif kind.kind == "Pod":
        pod_errors(errs, obj)
    elif kind.kind == "Node":
        node_errors(errs, obj)
    elif kind.kind == "PersistentVolumeClaim":
        claim_volume_errors(errs, obj)
    elif kind.kind == "PersistentVolume":
        persistent_volume_errors(errs, obj)
    elif kind.kind == "CSIStorageCapacity":
        csi_storage_capacity_errors(errs, obj)
    errs.raise_if_any(kind, str(_map(obj.get("metadata")).get("name") or ""))
