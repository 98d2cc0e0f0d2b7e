"""``LoaderConfig``: a :class:`Loader`'s parameters, validated once and frozen.

Built once by ``Loader()`` and passed down whole — to the epoch job each worker runs
(pickled with it), to the reader it opens, to the worker pool — never copied field by
field. The one field that changes over a loader's life, the worker count that
``num_workers="auto"`` chooses after the first epoch, changes by replacing the whole
object (:meth:`LoaderConfig.with_workers`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from astream._checks import check_int
from astream.errors import ConfigError

__all__ = ["WORKER_MODES", "BatchTransform", "Collate", "LoaderConfig"]

WORKER_MODES = ("process", "thread")

Collate = Callable[[list[dict[str, Any]]], Any]
BatchTransform = Callable[[Any], Any]


@dataclass(frozen=True)
class LoaderConfig:
    """Every parameter of a loader, validated; see :class:`Loader` for each.

    ``num_workers`` is the count the next epoch runs with (0 while ``auto`` has not chosen).
    """

    batch_size: int
    num_workers: int
    auto_workers: bool
    collate_fn: Collate | None
    drop_last: bool
    prefetch_batches: int
    worker_mode: str
    batch_transform: BatchTransform | None
    persistent_workers: bool
    progress: bool

    @classmethod
    def of(
        cls, dataset_batch_size: int | None, batch_size: int | None, num_workers: int | str, collate_fn: Any,
        drop_last: bool, prefetch_batches: int, worker_mode: str, batch_transform: Any,
        persistent_workers: bool, progress: bool,
    ) -> LoaderConfig:
        """The validated configuration of ``Loader(...)``'s arguments.

        Raises:
            ConfigError: no batch size anywhere, or a bad parameter (named, with its value).
        """
        size = batch_size if batch_size is not None else dataset_batch_size
        if size is None or isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(
                f"batch_size must be an int >= 1 (here or on the dataset), got {size!r}"
            )
        if dataset_batch_size is not None and size != dataset_batch_size:
            # The epoch plan deals samples in per-device batches of the dataset's batch_size;
            # batches of another size would not line up with it, and a saved state would
            # resume at the wrong place.
            raise ConfigError(
                f"Loader batch_size={size} differs from the dataset's batch_size={dataset_batch_size}; "
                "leave one of them unset or make them equal"
            )
        auto = num_workers == "auto"
        if auto:
            num_workers = 0
        elif isinstance(num_workers, str):
            raise ConfigError(f"num_workers must be an int >= 0 or 'auto', got {num_workers!r}")
        workers = check_int("num_workers", num_workers, 0)
        prefetch = check_int("prefetch_batches", prefetch_batches, 1)
        if worker_mode not in WORKER_MODES:
            raise ConfigError(f"worker_mode={worker_mode!r} is not one of {', '.join(WORKER_MODES)}")
        if collate_fn is not None and not callable(collate_fn):
            raise ConfigError("collate_fn must be callable")
        if batch_transform is not None and not callable(batch_transform):
            raise ConfigError("batch_transform must be a function of one batch")
        if not isinstance(progress, bool):
            raise ConfigError(f"progress must be True or False, got {progress!r}")
        return cls(size, workers, auto, collate_fn, bool(drop_last), prefetch, worker_mode, batch_transform,
                   bool(persistent_workers), progress)

    @property
    def processes(self) -> bool:
        """Whether workers (chosen now, or by ``auto`` later) are processes."""
        return self.worker_mode == "process"

    @property
    def readers(self) -> int:
        """Readers per rank: one per worker, or the iterating process's own."""
        return max(1, self.num_workers)

    def with_workers(self, workers: int) -> LoaderConfig:
        """The same configuration with ``auto``'s chosen worker count."""
        return replace(self, num_workers=workers)
