"""Devices on their way out (controller.releases): which pods may wait for them, and the
bound on waiting (an overdue release wakes its waiters to be tried and reported as usual)."""

from __future__ import annotations

import asyncio

from controller.releases import Releases


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_release_is_waited_for_by_the_pods_of_its_classes_until_it_lands() -> None:
    clock = Clock()
    releases = Releases(lambda classes: None, wait_s=10.0, clock=clock)
    assert not releases.pending(frozenset({"gpu"}))
    releases.expect("ns/a", frozenset({"gpu", "gpu-any"}))
    assert releases.pending(frozenset({"gpu"}))
    assert releases.pending(None)  # a pod of extended resources: any class may help it
    assert not releases.pending(frozenset({"nic"}))
    releases.landed("ns/a")
    assert not releases.pending(frozenset({"gpu"}))
    releases.expect("ns/b", None)  # its devices' classes are not known: it may help anyone
    assert releases.pending(frozenset({"nic"}))


def test_a_release_is_waited_for_only_so_long() -> None:
    clock = Clock()
    releases = Releases(lambda classes: None, wait_s=10.0, clock=clock)
    releases.expect("ns/a", frozenset({"gpu"}))
    clock.now += 9.9
    assert releases.pending(frozenset({"gpu"}))
    clock.now += 0.1
    assert not releases.pending(frozenset({"gpu"}))
    assert len(releases) == 0


def test_an_overdue_release_wakes_its_waiters_once_and_a_landed_one_does_not() -> None:
    woken: list[frozenset[str] | None] = []

    async def main() -> None:
        releases = Releases(woken.append, wait_s=0.05)
        releases.expect("ns/late", frozenset({"gpu"}))
        releases.expect("ns/on-time", frozenset({"mig"}))
        releases.landed("ns/on-time")
        releases.expect("ns/again", frozenset({"a"}))
        releases.expect("ns/again", frozenset({"b"}))  # expected anew: the first timer is void
        await asyncio.sleep(0.2)
        assert len(releases) == 0

    asyncio.run(main())
    assert sorted(map(sorted, woken)) == [["b"], ["gpu"]]
