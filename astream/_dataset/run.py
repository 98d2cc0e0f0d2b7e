"""``RunState``: where a dataset's run stands — the epoch, a resume point, run-wide values.

MosaicML fixes ``num_canonical_nodes``, the seed and the first run's node count at the
first iteration (or takes them from a loaded state); the epoch comes from the node's
agreement at each iteration. This object owns those values and turns them into and
from the resumable state dict. It holds no resources and pickles with the dataset.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Protocol

from astream._dataset.config import DatasetConfig
from astream._dataset.mixture import (
    MIXTURE_KEY,
    MixtureHistory,
    align,
    continue_history,
    pack_seen,
    unpack_seen,
)
from astream._dataset.state import EpochState
from astream._sampling.defaults import resolve_num_canonical_nodes
from astream._sampling.plan import EpochPlan
from astream._sampling.remix import Mixture, Seen
from astream.errors import ConfigError, StateError

__all__ = ["RunState"]

# Plans an epoch under the run values in force: (epoch, sample_in_epoch) -> plan.
PlanAt = Callable[[int, int], EpochPlan]


class PositionWatch(Protocol):
    """Told when a loaded state moves the position (the start-up prelude, which reacts to it:
    :mod:`astream._dataset.start.prelude`); ``load`` itself only sets the position."""

    def moving(self) -> None: ...

    def moved(self, state: EpochState | None) -> None: ...  # None: the load failed, nothing moved


class RunState:
    """The run's position and run-wide sampling values, for one dataset."""

    def __init__(self, config: DatasetConfig, fingerprint: str, mixture: MixtureHistory) -> None:
        self._config = config
        self.fingerprint = fingerprint
        self.mixture = mixture  # the dataset's own mixture, as a state records it
        # An epoch whose mixture changed: its history (the last mixture is the dataset's).
        self.history: MixtureHistory | None = None
        self.history_epoch = -1
        self._history_plan: tuple[tuple[Mixture, ...], str, dict[Hashable, Seen]] | None = None
        self.resume: EpochState | None = None
        self.ncn: int | None = None  # fixed at the first iteration, or by a loaded state
        self.seed: int = config.shuffle_seed
        self.initial_physical_nodes: int | None = None
        self.epoch = 0
        self.offset = 0  # where the current epoch started (a resumed one starts further in)
        self._cache_checked = False
        self.watch: PositionWatch | None = None  # (this process's: never pickled or copied)

    def first_cache_check(self) -> bool:
        """True the first time it is asked (the cache's thrashing warning is given once)."""
        first, self._cache_checked = not self._cache_checked, True
        return first

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
        if epoch != self.history_epoch:  # another epoch: a plain one of the dataset's mixture
            self._set_history(None, -1)
        return epoch, offset

    def history_of(self, epoch: int, sample_in_epoch: int) -> tuple[tuple[Mixture, ...], str, dict[Hashable, Seen]] | None:
        """The mixture history of ``epoch``, its digest and what its earlier segments delivered
        (filled by the plans), if its mixture changed before ``sample_in_epoch`` (a position
        before the change asks about the plain epoch: ``len``)."""
        if epoch != self.history_epoch or self._history_plan is None:
            return None
        return self._history_plan if sample_in_epoch >= self._history_plan[0][-1].start else None

    def _set_history(self, history: MixtureHistory | None, epoch: int) -> None:
        if history is not None and not history.changed:
            history = None
        self.history, self.history_epoch = history, epoch if history is not None else -1
        self._history_plan = None if history is None else (history.plan_history(), history.token(), {})

    def __getstate__(self) -> dict[str, Any]:
        # What a changed epoch's earlier segments delivered travels to the loader's workers
        # as bits (they would otherwise each replay those segments' shuffles).
        state = dict(self.__dict__)
        state.pop("watch", None)
        if self._history_plan is not None:
            mixtures, token, seen = self._history_plan
            state["_history_plan"] = (mixtures, token, pack_seen(seen))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        packed = state.get("_history_plan")
        self.__dict__.update(state)
        self.watch = None
        if packed is not None:
            mixtures, token, bits = packed
            self._history_plan = (mixtures, token, unpack_seen(bits))

    def state_dict(self, num_samples: int, from_beginning: bool) -> dict[str, Any]:
        """The state after ``num_samples`` samples (all ranks) of the current epoch."""
        if self.resume is not None:
            epoch, offset = self.resume.epoch, self.resume.sample_in_epoch
        else:
            epoch, offset = self.epoch, self.offset
        sample = num_samples if from_beginning else offset + num_samples
        out = EpochState(epoch, sample, self.ncn or self._resolved_ncn(), self.seed,
                         self.initial_physical_nodes or self._config.world.num_nodes, self.fingerprint).to_dict()
        history = self.history if epoch == self.history_epoch and self.history is not None else self.mixture
        out[MIXTURE_KEY] = history.to_dict()
        return out

    def load(self, obj: Any, plan_at: PlanAt) -> None:
        """Take a state (astream's or MosaicML's) to resume from at the next iteration.

        ``plan_at`` plans an epoch under the values in force: the state's are tried, and
        the previous ones restored if it does not fit.
        It sets the position and nothing else; the :attr:`watch`, if any, is told before and
        after (the start-up prelude reacts: it holds the node's start while the state is
        checked, then prefetches and decodes what the position reads first).

        Raises:
            StateError: missing keys, wrong types, another dataset, a position past the
                epoch, or a world the state cannot be resumed on.
        """
        watch = self.watch
        if watch is not None:
            watch.moving()
        moved = None
        try:
            self._load(obj, plan_at)
            moved = self.resume
        finally:
            if watch is not None:
                watch.moved(moved)

    def _load(self, obj: Any, plan_at: PlanAt) -> None:
        state = EpochState.from_dict(obj)
        history = self._history_after(state, obj)
        saved = (self.ncn, self.seed, self.initial_physical_nodes, self.history, self.history_epoch)
        self.ncn, self.seed, self.initial_physical_nodes = (state.num_canonical_nodes, state.shuffle_seed,
                                                            state.initial_physical_nodes)
        self._set_history(history, state.epoch)
        try:
            # (a changed epoch's plan checks its position itself: segments, then the partition)
            epoch_size = plan_at(state.epoch, 0).epoch_size if self.history is None else state.sample_in_epoch
            if state.sample_in_epoch > epoch_size:
                raise StateError(
                    f"sample_in_epoch={state.sample_in_epoch} is past the end of the epoch ({epoch_size} "
                    "samples); this state belongs to another dataset or epoch_size"
                )
            plan_at(state.epoch, state.sample_in_epoch)
        except ConfigError as exc:
            self._restore(saved)
            raise StateError(f"cannot resume this state on the current world: {exc}") from exc
        except StateError:
            self._restore(saved)
            raise
        self.resume = state

    def _restore(self, saved: tuple[int | None, int, int | None, MixtureHistory | None, int]) -> None:
        self.ncn, self.seed, self.initial_physical_nodes = saved[:3]
        self._set_history(saved[3], saved[4])

    def _history_after(self, state: EpochState, obj: Any) -> MixtureHistory | None:
        """The mixture history a loaded state resumes under (None: a plain epoch of the
        dataset's mixture), or :class:`StateError` where it may not resume (``on_mixture_change``)."""
        record = obj.get(MIXTURE_KEY)
        saved = None if record is None else MixtureHistory.from_dict(record)
        if saved is not None and state.sample_in_epoch == 0:
            saved = saved.at_start()  # nothing delivered yet (also an adapter's "next epoch" state)
        same_data = state.fingerprint is None or state.fingerprint == self.fingerprint
        continuing = self._config.on_mixture_change == "continue"
        if saved is None:  # MosaicML's states, and astream's before the record existed
            if continuing and not same_data:
                raise StateError(
                    "this state records no mixture (it was saved by MosaicML Streaming or an older astream), so "
                    "it can only resume the streams and weights it was saved with; start a fresh epoch instead"
                )
            state.check_fingerprint(self.fingerprint)
            return None
        mine = align(saved, self.mixture)
        if same_data and saved.mixtures[-1].same_mixture(mine.mixtures[0]):
            # The mixture it was saved under (a changed epoch goes on under its history).
            return MixtureHistory({**saved.streams, **mine.streams}, saved.mixtures)
        if not continuing:
            if same_data and not saved.changed:
                return None  # only epoch_size differs: resumed as before the record existed
            state.check_fingerprint(self.fingerprint)
            raise StateError(
                "this state was saved under another mixture of streams (weights, streams or epoch_size); pass "
                "on_mixture_change='continue' to go on with this one from the state's position, or start a "
                "fresh epoch instead of resuming"
            )
        return continue_history(saved, mine, state.sample_in_epoch)
