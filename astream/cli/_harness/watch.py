"""Peaks sampled while something runs in this process: a folder's bytes on disk, and the
resident memory of given processes (the conversion benchmarks' staging disk, a Spark
driver's and JVM's memory)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["FolderPeak", "RssPeak"]


class _Sampler:
    def __init__(self, every: float) -> None:
        self.every = every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)

    def __enter__(self) -> _Sampler:  # (re-entered once per run: the peaks accumulate)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()


class FolderPeak(_Sampler):
    """The largest total size of the files under ``folder`` (every 5 ms)."""

    def __init__(self, folder: Path) -> None:
        super().__init__(0.005)
        self.folder, self.peak = folder, 0

    def sample(self) -> None:
        total = 0
        for here, _, names in os.walk(self.folder):
            for name in names:
                with contextlib.suppress(OSError):
                    total += os.path.getsize(os.path.join(here, name))
        self.peak = max(self.peak, total)


class RssPeak(_Sampler):
    """The largest RSS of each of ``processes`` (``psutil.Process`` objects; every 10 ms)."""

    def __init__(self, processes: Sequence[Any]) -> None:
        super().__init__(0.01)
        self.processes, self.peaks = list(processes), [0] * len(processes)

    def sample(self) -> None:
        for k, p in enumerate(self.processes):
            with contextlib.suppress(Exception):
                self.peaks[k] = max(self.peaks[k], p.memory_info().rss)
