"""``PlanOptions``: every knob of an epoch plan, validated and resolved once, frozen.

An :class:`~astream._sampling.plan.EpochPlan` is a function of its streams and these
options. Callers that already hold validated settings (the dataset's configuration)
build one object and pass it whole; ``EpochPlan(...)`` and ``plan_epoch(...)`` keep their
keyword parameters as a convenience and build it from them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from astream._checks import check_choice, check_int, check_optional_int
from astream._sampling import defaults
from astream._units import parse_count
from astream.errors import ConfigError

__all__ = ["PlanOptions"]


@dataclass(frozen=True)
class PlanOptions:
    """The sampling knobs, world shape and position of one epoch (see :class:`EpochPlan`).

    ``num_canonical_nodes`` and ``shuffle_block_size`` are resolved to MosaicML's defaults
    when left ``None`` (``resolved`` says what was given); ``epoch_size`` is parsed.

    Raises:
        ConfigError: any value MosaicML would reject, named.
    """

    batch_size: int
    shuffle: bool = False
    shuffle_algo: str = defaults.DEFAULT_SHUFFLE_ALGO
    shuffle_seed: int = defaults.DEFAULT_SHUFFLE_SEED
    num_canonical_nodes: int | None = None
    shuffle_block_size: int | None = None
    partition_algo: str = defaults.DEFAULT_PARTITION_ALGO
    num_physical_nodes: int = 1
    ranks_per_node: int = 1
    workers_per_rank: int = 1
    epoch: int = 0
    sample_in_epoch: int = 0
    initial_physical_nodes: int | None = None
    epoch_size: int | str | None = None
    sampling_method: str = defaults.DEFAULT_SAMPLING_METHOD
    sampling_granularity: int = defaults.DEFAULT_SAMPLING_GRANULARITY
    batching_method: str = defaults.DEFAULT_BATCHING_METHOD

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        put("shuffle", bool(self.shuffle))
        put("shuffle_algo", check_choice("shuffle_algo", self.shuffle_algo, defaults.SHUFFLE_ALGOS))
        put("shuffle_seed", check_int("shuffle_seed", self.shuffle_seed, 0))
        put("partition_algo", check_choice("partition_algo", self.partition_algo, defaults.PARTITION_ALGOS))
        put("batch_size", check_int("batch_size", self.batch_size, 1))
        put("num_physical_nodes", check_int("num_physical_nodes", self.num_physical_nodes, 1))
        put("ranks_per_node", check_int("ranks_per_node", self.ranks_per_node, 1))
        put("workers_per_rank", check_int("workers_per_rank", self.workers_per_rank, 1))
        put("epoch", check_int("epoch", self.epoch, 0))
        put("sample_in_epoch", check_int("sample_in_epoch", self.sample_in_epoch, 0))
        put("initial_physical_nodes", check_optional_int("initial_physical_nodes", self.initial_physical_nodes, 1))
        put("sampling_method", check_choice("sampling_method", self.sampling_method, defaults.SAMPLING_METHODS))
        put("sampling_granularity", check_int("sampling_granularity", self.sampling_granularity, 1))
        put("batching_method", check_choice("batching_method", self.batching_method, defaults.BATCHING_METHODS))
        ncn = check_optional_int("num_canonical_nodes", self.num_canonical_nodes, 0)
        if ncn is not None and ncn > defaults.MAX_CANONICAL_NODES:
            raise ConfigError(f"num_canonical_nodes={ncn} is over {defaults.MAX_CANONICAL_NODES} (64 per node for "
                              "16,384 nodes), the most a plan takes: each costs memory and time")
        put("num_canonical_nodes", defaults.resolve_num_canonical_nodes(ncn, self.shuffle_algo, self.num_physical_nodes))
        block = check_optional_int("shuffle_block_size", self.shuffle_block_size, 1)
        put("shuffle_block_size", defaults.resolve_shuffle_block_size(block, self.resolved_ncn))
        if self.shuffle and self.shuffle_algo == "py1br" and int(0.75 * self.resolved_block) < 1:
            raise ConfigError(f"shuffle_block_size must be >= 2 for py1br, got {self.resolved_block}")
        put("epoch_size", None if self.epoch_size is None else parse_count(self.epoch_size, "epoch_size"))

    @property
    def resolved_ncn(self) -> int:
        """``num_canonical_nodes`` after MosaicML's defaults (never None once built)."""
        assert self.num_canonical_nodes is not None
        return self.num_canonical_nodes

    @property
    def resolved_block(self) -> int:
        """``shuffle_block_size`` after MosaicML's defaults (never None once built)."""
        assert self.shuffle_block_size is not None
        return self.shuffle_block_size

    @property
    def given_epoch_size(self) -> int | None:
        return self.epoch_size if isinstance(self.epoch_size, int) else None

    def at(self, **changes: Any) -> PlanOptions:
        """The same options with some changed (e.g. another epoch or resume point)."""
        return replace(self, **changes)
