"""The pre-bind wait: between a placement's writes and its pod's binding, without a write slot.

kube-scheduler's PreBind plugins wait for other controllers before a pod is bound:
VolumeBinding until the PV controller and the provisioner have bound the pod's volume claims
(:mod:`controller.volumes`), DynamicResources until the devices' binding conditions are met
(:mod:`controller.binding`). Both are the same wait, :func:`wait_until_ready`: read from the
watch caches what is still pending (raising at once when waiting longer cannot help), wake on
every change of what the caller watches, and give up at the caller's timeout. The committer
(:mod:`controller.commit`) runs it holding no write slot, so a slow provisioner or device
attachment never holds up other pods' placements.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from kubeapi.tasks import wait_at_most


async def wait_until_ready(
    pending: Callable[[], Sequence[str]],
    changed: asyncio.Event,
    *,
    timeout_s: float,
    timed_out: Callable[[Sequence[str]], BaseException],
) -> float:
    """Wait until ``pending()`` (what is not ready yet; it raises when waiting cannot help)
    is empty, checking again each time ``changed`` is set (by the caller's cache listener).
    Past ``timeout_s``, raises ``timed_out(still pending)``. Returns the seconds waited."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + timeout_s
    while True:
        changed.clear()
        left = pending()
        if not left:
            return loop.time() - started
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise timed_out(left)
        # On a timeout: checked once more, then reported above.
        await wait_at_most(changed.wait(), remaining)
