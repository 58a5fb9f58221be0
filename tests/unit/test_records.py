"""driver.api.records: a builder gives what the class's __init__ gives, at every field kind."""

from __future__ import annotations

import dataclasses

import pytest

from driver.api.records import builder


@dataclasses.dataclass(frozen=True, slots=True)
class _Record:
    name: str
    count: int = 3
    tags: dict[str, int] = dataclasses.field(default_factory=dict)
    kept: tuple[int, ...] = dataclasses.field(default=(), compare=False)
    cached: int | None = dataclasses.field(default=None, init=False)
    listed: list[int] = dataclasses.field(default_factory=list, init=False)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("a",), {}),
        (("a", 5), {}),
        (("a", 5, {"x": 1}, (1, 2)), {}),
        ((), {"name": "b", "tags": {"y": 2}}),
        (("c",), {"kept": (9,)}),
    ],
)
def test_builder_builds_what_init_builds(
    args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    build = builder(_Record)
    built = build(*args, **kwargs)  # type: ignore[arg-type]
    expected = _Record(*args, **kwargs)  # type: ignore[arg-type]
    assert type(built) is _Record
    assert built == expected
    assert repr(built) == repr(expected)
    assert [getattr(built, f.name) for f in dataclasses.fields(_Record)] == [
        getattr(expected, f.name) for f in dataclasses.fields(_Record)
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.name = "z"  # type: ignore[misc]


def test_builder_defaults_are_fresh_per_instance() -> None:
    build = builder(_Record)
    first, second = build("a"), build("b")
    assert first.tags == {}
    assert first.tags is not second.tags
    assert first.listed is not second.listed


def test_builder_refuses_what_init_does_more_than_store() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        value: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True, slots=True)
    class WithInitVar:
        value: int
        scale: dataclasses.InitVar[int] = 1

    @dataclasses.dataclass(frozen=True)
    class Unslotted:
        value: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class KeywordOnly:
        value: int = dataclasses.field(kw_only=True)

    for cls in (Checked, WithInitVar, Unslotted, KeywordOnly, int):
        with pytest.raises(TypeError):
            builder(cls)
