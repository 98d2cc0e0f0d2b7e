"""JAX: batches copied to the devices ahead of the step that needs them.

::

    from astream.adapters.jax import device_prefetch

    for batch in device_prefetch(loader, size=2, sharding=data_sharding):
        state, loss = train_step(state, batch["x"], batch["y"])

``jax.device_put`` returns at once and copies in the background, so keeping ``size``
batches in flight overlaps the host-to-device copies with the step running now. With a
``sharding`` and several processes (``jax.distributed``), each process's batch is its
part of one global array (``jax.make_array_from_process_local_data``): with astream's
per-rank order, rank ``r`` loads the ``r``-th slice of the global batch. jax is
imported only when batches flow; without it, importing this module raises
:class:`~astream.errors.MissingExtraError`.
"""

from __future__ import annotations

import collections
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from astream.adapters._extras import require
from astream.errors import ConfigError

require("jax", "astream.adapters.jax", "jax")

__all__ = ["adevice_prefetch", "device_prefetch", "to_device"]

# NumPy kinds that have a device form: bool, signed, unsigned, float, complex.
_NUMERIC_KINDS = "biufc"


def _leaf_putter(sharding: Any) -> Callable[[Any], Any]:
    import jax

    multi = sharding is not None and jax.process_count() > 1

    def put(value: Any) -> Any:
        if isinstance(value, np.ndarray) and value.dtype.kind not in _NUMERIC_KINDS:
            return value  # object/str arrays stay on the host
        if not isinstance(value, (np.ndarray, np.generic, jax.Array)):
            return value  # str, bytes, decoded images...
        if multi:
            return jax.make_array_from_process_local_data(sharding, np.asarray(value))  # type: ignore[no-untyped-call,unused-ignore]
        return jax.device_put(value, sharding)

    return put


def to_device(batch: Any, sharding: Any = None) -> Any:
    """Start copying a batch's numeric arrays to the device(s); other values stay.

    Args:
        batch: a dict of columns (or any pytree) of NumPy arrays; lists of text stay lists.
        sharding: None (the default device), a ``jax.sharding.Sharding`` for every
            array, or a mapping from column name to a sharding (missing names: default).

    Returns:
        The same structure with ``jax.Array`` leaves (copies may still be in flight).
    """
    import jax

    if isinstance(sharding, Mapping):
        if not isinstance(batch, Mapping):
            raise ConfigError("a sharding per column needs batches that are dicts of columns")
        unknown = [name for name in sharding if name not in batch]
        if unknown:
            raise ConfigError(f"sharding names column(s) {', '.join(map(repr, unknown))} that the batch lacks")
        return {name: jax.tree_util.tree_map(_leaf_putter(sharding.get(name)), value)
                for name, value in batch.items()}
    return jax.tree_util.tree_map(_leaf_putter(sharding), batch)


def _check_size(size: int) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"size must be an int >= 1 (batches in flight), got {size!r}")


def device_prefetch(batches: Iterable[Any], size: int = 2, sharding: Any = None) -> Iterator[Any]:
    """Yield batches already on the device(s), keeping ``size`` copies in flight.

    Args:
        batches: a :class:`~astream.Loader` (one epoch) or any iterable of batches.
        size: batches transferred ahead of the one being used.
        sharding: see :func:`to_device`. With several processes, each process gives its
            own batch and gets its share of the global array; the global batch is the
            processes' batches stacked in process order (use ``drop_last=True`` so every
            batch divides over the devices).

    Yields:
        Batches whose numeric arrays are ``jax.Array`` on the target devices.
    """
    _check_size(size)
    source = iter(batches)
    ahead: collections.deque[Any] = collections.deque()
    try:
        for batch in source:
            ahead.append(to_device(batch, sharding))
            if len(ahead) > size:
                yield ahead.popleft()
        while ahead:
            yield ahead.popleft()
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()  # stop the loader's epoch when the consumer stops early


async def adevice_prefetch(batches: AsyncIterable[Any], size: int = 2, sharding: Any = None) -> AsyncIterator[Any]:
    """:func:`device_prefetch` for ``async for`` (a Loader's async iteration).

    Use it as ``async for batch in adevice_prefetch(loader): ...``; stopping early
    closes the loader's epoch when this generator is closed (``aclose``).
    """
    _check_size(size)
    source = aiter(batches)
    ahead: collections.deque[Any] = collections.deque()
    try:
        async for batch in source:
            ahead.append(to_device(batch, sharding))
            if len(ahead) > size:
                yield ahead.popleft()
        while ahead:
            yield ahead.popleft()
    finally:
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()
