"""TensorFlow: a ``tf.data.Dataset`` over a Loader, typed from the dataset's columns.

::

    from astream.adapters.tf import as_tf_dataset

    train = as_tf_dataset(loader, x="image", y="label").prefetch(2)
    model.fit(train, epochs=10)

The element spec comes from the MDS encodings: ``ndarray:float32:3,32,32`` becomes a
``float32`` tensor of shape ``(batch, 3, 32, 32)``, scalar columns ``(batch,)``, ``str``
and ``bytes`` columns ``tf.string``. The batch dimension is the loader's batch size when
it drops incomplete batches, else None. tensorflow is imported only when a dataset is
made; without it, importing this module raises :class:`~astream.errors.MissingExtraError`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from astream import Loader
from astream.adapters._columns import ColumnKind, Columns, column_kind, select_columns
from astream.adapters._cursor import EpochCursor
from astream.adapters._extras import require
from astream.errors import ConfigError

require("tensorflow", "astream.adapters.tf", "tf")

__all__ = ["as_tf_dataset", "column_specs"]


def _kinds(loader: Loader, columns: Sequence[str] | None) -> dict[str, ColumnKind]:
    available = loader.dataset.columns
    names = list(available) if columns is None else list(columns)
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ConfigError(f"columns= names unknown column(s) {', '.join(map(repr, unknown))}; "
                          f"the dataset has {', '.join(map(repr, available))}")
    kinds = {n: column_kind(available[n]) for n in names}
    untyped = [n for n, k in kinds.items() if k.dtype is None]
    if untyped:
        raise ConfigError(
            "column(s) " + ", ".join(f"{n!r} ({available[n]})" for n in untyped) + " have no tensor form; "
            "leave them out with columns=[...], or give the loader a collate_fn and as_tf_dataset an "
            "output_signature"
        )
    return kinds


def column_specs(loader: Loader, columns: Sequence[str] | None = None) -> dict[str, Any]:
    """``tf.TensorSpec`` of each column of a loader's batches, from the MDS encodings.

    Raises:
        ConfigError: an unknown column, or one with no tensor form (json, pkl, images).
    """
    import tensorflow as tf

    batch = loader.batch_size if loader.drop_last else None
    specs = {}
    for name, kind in _kinds(loader, columns).items():
        dtype = tf.string if kind.dtype == "string" else tf.as_dtype(kind.dtype)
        shape = None if kind.shape is None else (batch, *kind.shape)
        specs[name] = tf.TensorSpec(shape, dtype, name=name)
    return specs


def _text(values: Any) -> np.ndarray:
    # tf.string takes an object array of bytes; str and Decimal values are encoded.
    return np.array([v if isinstance(v, bytes) else str(v).encode("utf-8") for v in values], dtype=object)


def _flat_converter(kinds: Mapping[str, ColumnKind], order: Sequence[str]) -> Callable[[dict[str, Any]], list[Any]]:
    """Batch dict -> the element's flat tensor values, in ``tf.nest.flatten`` order of its structure."""
    steps = [(name, kinds[name].dtype == "string") for name in order]

    def convert(batch: dict[str, Any]) -> list[Any]:
        out = []
        for name, text in steps:
            value = batch[name]
            if text:
                out.append(_text(value))
            elif isinstance(value, np.ndarray):
                out.append(value)
            else:
                raise ConfigError(
                    f"column {name!r} holds samples of different shapes in one batch, which a dense tensor "
                    "cannot; pad them with the loader's collate_fn (and pass output_signature), or leave the "
                    "column out with columns=[...]"
                )
        return out

    return convert


def as_tf_dataset(
    loader: Loader,
    *,
    x: Columns = None,
    y: Columns = None,
    sample_weight: Columns = None,
    columns: Sequence[str] | None = None,
    epochs: int | None = 1,
    output_signature: Any = None,
) -> Any:
    """A ``tf.data.Dataset`` of a loader's batches.

    Each pass over the dataset iterates the loader for ``epochs`` epochs (``model.fit``
    makes one pass per Keras epoch), so the batches and their order are the loader's.

    Args:
        loader: the loader.
        x: input column name(s): elements become ``(x,)``, ``(x, y)`` or ``(x, y, w)``
            tuples as ``model.fit`` takes them (several names: a dict by name).
        y: target column name(s).
        sample_weight: sample-weight column name(s).
        columns: with no ``x``, the columns of each element (a dict); default all.
        epochs: loader epochs per pass; None for an endless stream (give ``fit`` a
            ``steps_per_epoch``; also the way to resume ``fit`` mid-epoch from a loaded state).
        output_signature: the element spec, for loaders with a ``collate_fn`` (batches
            are then passed on as the loader makes them).

    Returns:
        The dataset; its cardinality is known when every pass has the same length.

    Raises:
        ConfigError: unknown columns, a column with no tensor form, a ``collate_fn``
            without ``output_signature``, or a bad ``epochs``.
    """
    import tensorflow as tf

    if not isinstance(loader, Loader):
        raise ConfigError(f"as_tf_dataset needs an astream.Loader, got {type(loader).__name__}")
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1):
        raise ConfigError(f"epochs must be an int >= 1 or None, got {epochs!r}")
    flat: Callable[[dict[str, Any]], list[Any]]
    if output_signature is not None:
        signature = output_signature
        flat = tf.nest.flatten
    else:
        if loader.collate_fn is not None:
            raise ConfigError("this loader has a collate_fn: pass output_signature= describing its batches")
        picked = [*_names(x), *_names(y), *_names(sample_weight)] if x is not None else columns
        kinds = _kinds(loader, picked)
        select = select_columns(loader.dataset.columns, x, y, sample_weight, None, leaf=_identity)
        signature = select(column_specs(loader, list(kinds)))
        # The element's leaves in tf.nest order, named: selecting names from {name: name}.
        flat = _flat_converter(kinds, tf.nest.flatten(select({name: name for name in kinds})))

    def batches() -> Iterator[list[Any]]:
        for _ in itertools.count() if epochs is None else range(epochs):
            for batch in loader:
                yield flat(batch)

    cardinality = _cardinality(loader, epochs)
    if cardinality is None:
        # Only a pass that resumes mid-epoch has no known length: the generator form.
        def packed() -> Iterator[Any]:
            for values in batches():
                yield tf.nest.pack_sequence_as(signature, values)

        return tf.data.Dataset.from_generator(packed, output_signature=signature)
    return _indexed(batches, signature, cardinality)


def _shape_check(specs: Sequence[Any]) -> Callable[[list[Any]], list[np.ndarray]]:
    """Checks each value against its spec's shape in Python (cheaper than ``tf.ensure_shape`` ops)."""
    dims = [None if s.shape.rank is None else tuple(s.shape.as_list()) for s in specs]
    names = [s.name or f"component {i}" for i, s in enumerate(specs)]

    def check(values: list[Any]) -> list[np.ndarray]:
        arrays = [np.asarray(v) for v in values]
        if len(arrays) != len(dims):
            raise ConfigError(f"a batch has {len(arrays)} tensor(s), the element spec {len(dims)}")
        for array, want, name in zip(arrays, dims, names, strict=True):
            if want is None:
                continue
            shape = array.shape
            if len(shape) != len(want) or any(w is not None and w != d for w, d in zip(want, shape, strict=True)):
                raise ConfigError(f"{name}: a batch of shape {shape} does not fit the element spec's {want}")
        return arrays

    return check


def _indexed(batches: Callable[[], Iterator[list[Any]]], signature: Any, cardinality: int) -> Any:
    """Element ``i`` of a pass is the next batch of the pass's iteration (started at ``i == 0``).

    ``Dataset.range(n).map(numpy_function)`` costs about a third of ``from_generator``
    per element, and the known length lets Keras plan its epochs. The map runs
    sequentially (no ``num_parallel_calls``), so elements come in the loader's order.
    Shapes are checked in Python and set statically (``set_shape``): no extra op per
    element.
    """
    import tensorflow as tf

    specs = tf.nest.flatten(signature)
    dtypes = [s.dtype for s in specs]
    check = _shape_check(specs)
    current: list[Iterator[list[Any]]] = []

    def pull(index: Any) -> list[np.ndarray]:
        if index == 0 or not current:
            for old in current:
                getattr(old, "close", lambda: None)()
            current[:] = [batches()]
        return check(next(current[0]))

    def element(index: Any) -> Any:
        flat = tf.numpy_function(pull, [index], dtypes, stateful=True)
        for tensor, spec in zip(flat, specs, strict=True):
            tensor.set_shape(spec.shape)
        return tf.nest.pack_sequence_as(signature, flat)

    source = tf.data.Dataset.counter() if cardinality == tf.data.INFINITE_CARDINALITY else tf.data.Dataset.range(cardinality)
    return source.map(element)


def _identity(value: Any) -> Any:
    return value


def _names(names: Columns) -> list[str]:
    return [names] if isinstance(names, str) else list(names or [])


def _cardinality(loader: Loader, epochs: int | None) -> int | None:
    import tensorflow as tf

    if epochs is None:
        return int(tf.data.INFINITE_CARDINALITY)
    cursor = EpochCursor(loader)
    full = len(loader.batch_ids(cursor.epoch, 0))
    # A loaded state makes the first pass shorter than the others: no single length.
    return full * epochs if len(cursor) == full else None
