"""No traceback is reachable from the command line: random bytes, random YAML and mutated
valid manifests given to ``simulate``, ``allocate``, ``cel`` and ``discover --fake`` end in a
documented exit code with at most one line on stderr.

The commands run in-process, so an unexpected exception fails the test with its traceback
(``biaxial``'s last-resort handler, exit 70, counts as a failure here too). The example
counts keep the fuzz to a few seconds in CI; set ``BIAXIAL_FUZZ_EXAMPLES`` for a longer run.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from biaxial.cli import main
from biaxial.simulate.manifests import load_objects
from driver.discovery.backend import open_backend
from driver.discovery.slices import build_slices

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("BIAXIAL_FUZZ_EXAMPLES", "30"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
#: command -> the exit codes its --help documents
EXIT_CODES: dict[str, set[int]] = {
    "simulate": {0, 2},  # 1 needs --fail-on-unschedulable
    "allocate": {0, 2},
    "cel": {0, 1, 2},
    "discover": {0, 1, 2},
}


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _check(command: str, argv: list[str]) -> None:
    code, _, err = _run([command, *argv])
    assert code in EXIT_CODES[command], (code, err)
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) <= 1, err
    if code != 0 and not (command == "cel" and code == 1):
        assert err.startswith(f"biaxial {command}: error: "), err


def _file(content: bytes, suffix: str = ".yaml") -> str:
    handle = tempfile.NamedTemporaryFile(suffix=suffix, delete=False)  # noqa: SIM115
    with handle:
        handle.write(content)
    return handle.name


def _with(content: bytes, check: Callable[[str], None]) -> None:
    path = _file(content)
    try:
        check(path)
    finally:
        Path(path).unlink()


# --------------------------------------------------------------------------- inputs

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=12,
)


def _valid_objects() -> list[dict[str, Any]]:
    objects = load_objects(
        [
            str(ROOT / "examples" / "requesting-gpus" / "cluster.yaml"),
            str(ROOT / "examples" / "requesting-gpus" / "numa-pairs.yaml"),
            str(ROOT / "examples" / "requesting-gpus" / "hami-style.yaml"),
            str(ROOT / "examples" / "hami" / "vllm-deployment.yaml"),
        ]
    )
    with open_backend("t4x4", node_name="n1") as backend:
        objects.extend(
            s.to_api()
            for s in build_slices(backend.discover(), node_name="n1", driver_name="gpu.biaxial.dev")
        )
    objects.append(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n1"},
            "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}},
        }
    )
    return objects


VALID = _valid_objects()


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out.extend(_paths(item, (*prefix, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out.extend(_paths(item, (*prefix, index)))
    return out


#: Values that pass the schema's shape checks but probe the semantics behind them.
TRICKY = st.sampled_from(
    ["0", "-1", "1Gi", "1.5", "", "x" * 70, "nvidia.com/gpu", "NoScheduel", "99999999999999999999"]
) | st.integers(-3, 10**20)


@st.composite
def mutated_manifests(draw: st.DrawFn) -> bytes:
    """The valid objects, each once, with one to three random edits: a value replaced by
    random JSON or a tricky scalar, a key removed or renamed, an object duplicated."""
    objects = copy.deepcopy(VALID)
    rng = random.Random(draw(st.integers(0, 2**32)))
    for _ in range(draw(st.integers(1, 3))):
        target = rng.choice(objects)
        path = rng.choice(_paths(target)[1:] or [()])
        if not path:
            continue
        parent = target
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        action = draw(st.sampled_from(["replace", "tricky", "delete", "rename", "duplicate"]))
        if action == "replace":
            parent[last] = draw(JSON_VALUES)
        elif action == "tricky":
            parent[last] = draw(TRICKY)
        elif action == "delete":
            del parent[last]
        elif action == "rename" and isinstance(parent, dict):
            parent[f"{last}x"] = parent.pop(last)
        elif action == "duplicate" and draw(st.booleans()):
            objects.append(copy.deepcopy(target))
    return yaml.safe_dump_all(objects, sort_keys=False).encode()


PROFILES = [
    yaml.safe_load((ROOT / "driver" / "discovery" / "profiles" / f"{name}.yaml").read_text())
    for name in ("t4x4", "h100-80gbx8")
]


@st.composite
def mutated_profiles(draw: st.DrawFn) -> bytes:
    """A fake GPU profile with one or two random edits."""
    profile = copy.deepcopy(draw(st.sampled_from(PROFILES)))
    rng = random.Random(draw(st.integers(0, 2**32)))
    for _ in range(draw(st.integers(1, 2))):
        path = rng.choice(_paths(profile)[1:])
        parent = profile
        for step in path[:-1]:
            parent = parent[step]
        if draw(st.booleans()):
            parent[path[-1]] = draw(JSON_VALUES | TRICKY)
        else:
            del parent[path[-1]]
    return yaml.safe_dump(profile).encode()


ANY_INPUT = st.one_of(
    st.binary(max_size=300),
    JSON_VALUES.map(lambda v: yaml.safe_dump(v).encode()),
    mutated_manifests(),
)


# --------------------------------------------------------------------------- the fuzz


@FUZZ
@given(content=ANY_INPUT)
def test_simulate_never_tracebacks(content: bytes) -> None:
    _with(content, lambda path: _check("simulate", [path]))


@FUZZ
@given(content=ANY_INPUT)
def test_allocate_never_tracebacks(content: bytes) -> None:
    _with(content, lambda path: _check("allocate", [path]))


@FUZZ
@given(
    content=ANY_INPUT,
    expression=st.sampled_from(["device.driver == 'gpu.biaxial.dev'", "1 +", "x"]),
)
def test_cel_never_tracebacks(content: bytes, expression: str) -> None:
    _with(content, lambda path: _check("cel", ["-e", expression, path]))


@FUZZ
@given(content=ANY_INPUT | mutated_profiles())
def test_discover_fake_profile_never_tracebacks(content: bytes) -> None:
    _with(content, lambda path: _check("discover", ["--fake", path, "--node", "n1"]))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["simulate", str(ROOT / "examples" / "reference-cluster.yaml"), "--plot", "out.txt"],
            "--plot out.txt",
        ),
        (["discover", "--fake", str(ROOT / "README.md")], "fake GPU profile"),
    ],
)
def test_known_tracebacks_are_one_line(argv: list[str], message: str) -> None:
    code, _, err = _run(argv)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_a_binary_profile_is_one_line() -> None:
    # The issue: a binary profile file given to discover --fake was a traceback.
    def check(path: str) -> None:
        code, _, err = _run(["discover", "--fake", path])
        assert code == 2
        assert err.strip() == (
            f"biaxial discover: error: fake GPU profile {path!r} is not a text (UTF-8 YAML) file"
        )

    _with(bytes(range(256)), check)
