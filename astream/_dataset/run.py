"""``RunState``: where a dataset's run stands — the epoch, a resume point, run-wide values.

MosaicML fixes ``num_canonical_nodes``, the seed and the first run's node count at the
first iteration (or takes them from a loaded state); the epoch comes from the node's
agreement at each iteration. This object owns those values and turns them into and
from the resumable state dict. It holds no resources and pickles with the dataset.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from astream._dataset.config import DatasetConfig
from astream._dataset.state import EpochState
from astream._sampling.defaults import resolve_num_canonical_nodes
from astream._sampling.plan import EpochPlan
from astream.errors import ConfigError, StateError

__all__ = ["RunState"]

# Plans an epoch under the run values in force: (epoch, sample_in_epoch) -> plan.
PlanAt = Callable[[int, int], EpochPlan]


class RunState:
    """The run's position and run-wide sampling values, for one dataset."""

    def __init__(self, config: DatasetConfig, fingerprint: str) -> None:
        self._config = config
        self.fingerprint = fingerprint
        self.resume: EpochState | None = None
        self.ncn: int | None = None  # fixed at the first iteration, or by a loaded state
        self.seed: int = config.shuffle_seed
        self.initial_physical_nodes: int | None = None
        self.epoch = 0
        self.offset = 0  # where the current epoch started (a resumed one starts further in)

    @property
    def current_epoch(self) -> int:
        return self.resume.epoch if self.resume is not None else self.epoch

    def _resolved_ncn(self) -> int:
        cfg = self._config
        return resolve_num_canonical_nodes(cfg.num_canonical_nodes, cfg.shuffle_algo, cfg.world.num_nodes)

    def fix_run_values(self) -> EpochState | None:
        """At an iteration's start: fix the run-wide values; return (and forget) a loaded state."""
        resume, self.resume = self.resume, None
        if self.ncn is None:
            self.ncn = self._resolved_ncn()
        if self.initial_physical_nodes is None:
            self.initial_physical_nodes = self._config.world.num_nodes
        return resume

    def started(self, epoch: int, resume: EpochState | None) -> tuple[int, int]:
        """The node agreed on ``epoch``: a loaded state of that epoch resumes at its sample."""
        offset = resume.sample_in_epoch if resume is not None and resume.epoch == epoch else 0
        self.epoch, self.offset = epoch, offset
        return epoch, offset

    def state_dict(self, num_samples: int, from_beginning: bool) -> dict[str, Any]:
        """The state after ``num_samples`` samples (all ranks) of the current epoch."""
        if self.resume is not None:
            epoch, offset = self.resume.epoch, self.resume.sample_in_epoch
        else:
            epoch, offset = self.epoch, self.offset
        sample = num_samples if from_beginning else offset + num_samples
        return EpochState(epoch, sample, self.ncn or self._resolved_ncn(), self.seed,
                          self.initial_physical_nodes or self._config.world.num_nodes, self.fingerprint).to_dict()

    def load(self, obj: Any, plan_at: PlanAt) -> None:
        """Take a state (astream's or MosaicML's) to resume from at the next iteration.

        ``plan_at`` plans an epoch under the values in force: the state's are tried, and
        the previous ones restored if it does not fit.

        Raises:
            StateError: missing keys, wrong types, another dataset, a position past the
                epoch, or a world the state cannot be resumed on.
        """
        state = EpochState.from_dict(obj)
        state.check_fingerprint(self.fingerprint)
        saved = (self.ncn, self.seed, self.initial_physical_nodes)
        self.ncn, self.seed, self.initial_physical_nodes = (state.num_canonical_nodes, state.shuffle_seed,
                                                            state.initial_physical_nodes)
        try:
            epoch_size = plan_at(state.epoch, 0).epoch_size
            if state.sample_in_epoch > epoch_size:
                raise StateError(
                    f"sample_in_epoch={state.sample_in_epoch} is past the end of the epoch ({epoch_size} "
                    "samples); this state belongs to another dataset or epoch_size"
                )
            plan_at(state.epoch, state.sample_in_epoch)
        except ConfigError as exc:
            self.ncn, self.seed, self.initial_physical_nodes = saved
            raise StateError(f"cannot resume this state on the current world: {exc}") from exc
        except StateError:
            self.ncn, self.seed, self.initial_physical_nodes = saved
            raise
        self.resume = state
