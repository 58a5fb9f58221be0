"""PATCH bodies: JSON patch (RFC 6902), JSON merge patch (RFC 7386) and strategic merge patch.

Strategic merge follows ``k8s.io/apimachinery/pkg/util/strategicpatch`` for the list fields the
built-in types declare with ``patchStrategy``: lists merged by key (``status.conditions`` by
``type``, ``status.reservedFor`` and ``metadata.ownerReferences`` by ``uid``, containers, env,
volumes, ``spec.resourceClaims`` and ``status.resourceClaimStatuses`` by ``name`` ...) and
``metadata.finalizers`` as a set. Supported directives: ``$patch: replace|delete|merge`` on
maps and on list items, ``$deleteFromPrimitiveList/<field>``, ``$setElementOrder/<field>``
(ordering honoured for merged lists), ``$retainKeys`` (keys not listed are dropped). Every other
list is replaced, as upstream does for fields without a patch strategy.

All functions are pure: they return new objects and never mutate their inputs.
"""

from __future__ import annotations

import json
from typing import Any, Final

import jsonpatch

from kubeapi import codec
from tests.emulator.errors import ApiStatusError, bad_request

JSON_PATCH: Final = "application/json-patch+json"
MERGE_PATCH: Final = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"

_WILD: Final = "*"

#: dotted path (list items are ``*``) -> merge key; ``""`` means a merged set of primitives.
MERGE_KEYS: Final[dict[str, str]] = {
    "metadata.finalizers": "",
    "metadata.ownerReferences": "uid",
    "status.conditions": "type",
    "status.reservedFor": "uid",
    "status.addresses": "type",
    "status.resourceClaimStatuses": "name",
    "spec.containers": "name",
    "spec.initContainers": "name",
    "spec.ephemeralContainers": "name",
    "spec.volumes": "name",
    "spec.resourceClaims": "name",
    "spec.containers.*.env": "name",
    "spec.containers.*.ports": "containerPort",
    "spec.containers.*.volumeMounts": "mountPath",
    "spec.initContainers.*.env": "name",
    "spec.initContainers.*.volumeMounts": "mountPath",
    "spec.imagePullSecrets": "name",
    "spec.hostAliases": "ip",
    "spec.schedulingGates": "name",
}
# Lists without a patch strategy upstream (status.containerStatuses, spec.tolerations,
# spec.taints, status.images, status.devices ...) are replaced as a whole.


def _bad(message: str) -> ApiStatusError:
    return bad_request(message)


def apply_json_patch(obj: dict[str, Any], body: bytes) -> dict[str, Any]:
    """Apply an RFC 6902 patch. A malformed patch is a 400; a failing op (``test``) a 422."""
    try:
        ops = json.loads(body)
    except ValueError as exc:
        raise _bad(f"error decoding patch: {exc}") from exc
    if not isinstance(ops, list):
        raise _bad("json patch must be a list of operations")
    try:
        patch = jsonpatch.JsonPatch(ops)
    except (jsonpatch.InvalidJsonPatch, TypeError, AttributeError) as exc:
        raise _bad(f"invalid JSON patch: {exc}") from exc
    try:
        result = patch.apply(obj)
    except jsonpatch.JsonPatchTestFailed as exc:
        raise ApiStatusError(
            422, "Invalid", f"the server rejected our request due to an error in our request: {exc}"
        ) from exc
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
        raise ApiStatusError(
            422, "Invalid", f"the server rejected our request due to an error in our request: {exc}"
        ) from exc
    except (TypeError, KeyError, IndexError, ValueError) as exc:
        raise _bad(f"invalid JSON patch: {exc}") from exc
    if not isinstance(result, dict):
        raise _bad("the patched document is not a JSON object")
    return result


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return codec.copy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _decode_object(body: bytes) -> dict[str, Any]:
    try:
        patch = json.loads(body)
    except ValueError as exc:
        raise _bad(f"error decoding patch: {exc}") from exc
    if not isinstance(patch, dict):
        raise _bad("a merge patch must be a JSON object")
    return patch


def apply_merge_patch(obj: dict[str, Any], body: bytes) -> dict[str, Any]:
    result = merge_patch(obj, _decode_object(body))
    assert isinstance(result, dict)
    return result


def apply_strategic_merge_patch(obj: dict[str, Any], body: bytes) -> dict[str, Any]:
    return _smp_map(obj, _decode_object(body), "")


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _smp_map(original: Any, patch: dict[str, Any], path: str) -> dict[str, Any]:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: codec.copy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return {}
    if directive not in {None, "merge"}:
        raise _bad(f"Unknown patch type: {directive} in map at {path or '.'}")
    result: dict[str, Any] = dict(original) if isinstance(original, dict) else {}
    retain = patch.get("$retainKeys")
    orders: dict[str, list[Any]] = {}
    deletions: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key in {"$patch", "$retainKeys"}:
            continue
        if key.startswith("$setElementOrder/"):
            if not isinstance(value, list):
                raise _bad(f"{key} must be a list")
            orders[key.split("/", 1)[1]] = value
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            if not isinstance(value, list):
                raise _bad(f"{key} must be a list")
            deletions[key.split("/", 1)[1]] = value
            continue
        if key.startswith("$"):
            raise _bad(f"unknown directive {key} at {path or '.'}")
        child = _child(path, key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            result[key] = _smp_map(result.get(key), value, child)
        elif isinstance(value, list) and _merge_key(child) is not None:
            result[key] = _smp_list(result.get(key), value, child)
        else:
            result[key] = codec.copy(value)
    for key, removed in deletions.items():
        current = result.get(key)
        if isinstance(current, list):
            result[key] = [item for item in current if item not in removed]
    for key, order in orders.items():
        current = result.get(key)
        if isinstance(current, list):
            result[key] = _reorder(current, order, _merge_key(_child(path, key)))
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_key(path: str) -> str | None:
    parts = path.split(".")
    generic = ".".join(_WILD if p.isdigit() else p for p in parts)
    return MERGE_KEYS.get(generic)


def _identity(item: Any, key: str) -> Any:
    if key == "":
        return json.dumps(item, sort_keys=True)
    return item.get(key) if isinstance(item, dict) else None


def _smp_list(original: Any, patch: list[Any], path: str) -> list[Any]:
    key = _merge_key(path)
    assert key is not None
    current = list(original) if isinstance(original, list) else []
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [codec.copy(i) for i in patch if not (isinstance(i, dict) and "$patch" in i)]
    if key == "":  # a set of primitives: union
        seen = {_identity(i, key) for i in current}
        for item in patch:
            if _identity(item, key) not in seen:
                current.append(codec.copy(item))
                seen.add(_identity(item, key))
        return _merged_order(current, patch, original or [], key)
    index = {_identity(item, key): pos for pos, item in enumerate(current)}
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise _bad(f"map: {item!r} does not contain declared merge key: {key} (at {path})")
        ident = item[key]
        if item.get("$patch") == "delete":
            if ident in index:
                current[index[ident]] = None
            continue
        if ident in index and current[index[ident]] is not None:
            current[index[ident]] = _smp_map(current[index[ident]], item, f"{path}.0")
        else:
            index[ident] = len(current)
            current.append(_smp_map({}, item, f"{path}.0"))
    merged = [item for item in current if item is not None]
    named = [i for i in patch if isinstance(i, dict) and "$patch" not in i]
    return _merged_order(merged, named, original or [], key)


def _merged_order(merged: list[Any], patch: list[Any], original: list[Any], key: str) -> list[Any]:
    """strategicpatch.normalizeElementOrder: the items the patch names in the patch's order,
    the others in the stored order, interleaved where both orders know them; so a new item
    comes before the stored ones it was not ordered against (``[a]`` + ``[b]`` is ``[b, a]``)."""
    in_patch = {_identity(i, key): n for n, i in enumerate(patch)}
    stored = {_identity(i, key): n for n, i in enumerate(original)}
    right = sorted(
        (i for i in merged if _identity(i, key) in in_patch),
        key=lambda i: in_patch[_identity(i, key)],
    )
    left = sorted(
        (i for i in merged if _identity(i, key) not in in_patch),
        key=lambda i: stored.get(_identity(i, key), 0),
    )
    out: list[Any] = []
    while left and right:
        lpos, rpos = stored.get(_identity(left[0], key)), stored.get(_identity(right[0], key))
        out.append(
            left.pop(0) if lpos is not None and rpos is not None and lpos < rpos else right.pop(0)
        )
    return out + left + right


def _reorder(items: list[Any], order: list[Any], key: str | None) -> list[Any]:
    if key is None:
        return items
    rank = {
        _identity(o, key) if key else json.dumps(o, sort_keys=True): n for n, o in enumerate(order)
    }
    ordered = sorted(
        (i for i in items if _identity(i, key) in rank), key=lambda i: rank[_identity(i, key)]
    )
    rest = [i for i in items if _identity(i, key) not in rank]
    return ordered + rest
