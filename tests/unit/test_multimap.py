"""driver.api.multimap: a key -> values index kept as tuples."""

from __future__ import annotations

from driver.api.multimap import Multimap


def test_values_are_kept_once_in_the_order_added_and_empty_keys_dropped() -> None:
    index: Multimap[str, str] = Multimap()
    assert index.get("p") == ()
    index.add("p", "a")
    index.add("p", "b")
    index.add("p", "a")
    assert index.get("p") == ("a", "b")
    index.discard("p", "a")
    index.discard("p", "z")
    index.discard("q", "a")
    assert index.get("p") == ("b",)
    assert len(index) == 1
    index.discard("p", "b")
    assert len(index) == 0
    index.add("p", "c")
    assert index.pop("p") == ("c",)
    assert index.pop("p") == ()
    assert len(index) == 0
