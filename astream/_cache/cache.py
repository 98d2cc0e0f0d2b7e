"""The on-disk shard cache of one node: layout, residency, pins and byte accounting.

Synchronous bookkeeping only; :mod:`astream._cache.engine` moves the bytes. The
local directory mirrors the remote: shard ``s`` of split ``train`` lives at
``<local>/train/<s.raw_data.basename>`` (plus the compressed file with ``keep_zip``).

Accounting: a ready shard counts its files on disk; a shard being installed counts
what it will occupy once done (reserved up front, so concurrent transfers can never
overshoot ``cache_limit``). Pinned shards are never evicted, nor are shards whose
only copy is local (a dataset without a remote is the user's data, not a cache).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from astream._cache.durability import CTIME_SLACK, MARKER_PREFIX, Marker, find_markers, pid_alive
from astream._cache.eviction import Candidate, choose_victims
from astream._cache.origin import ORIGIN_NAME
from astream._cache.plan_states import PLAN_FOLDER
from astream._cache.states import Entries, Entry, State
from astream._format.columns import columns_of
from astream._format.index import INDEX_NAME, FileInfo, Index, ShardInfo, SourceRanges
from astream.errors import CacheError

__all__ = ["Entry", "ShardCache", "State", "cache_path", "is_installed", "shard_files"]


@dataclass(frozen=True)
class ShardFile:
    """One file of a shard: as read (``raw``) and as stored remotely (``zip``, or None), or
    assembled from byte ranges of a source file (``source``: a Parquet row group)."""

    raw: FileInfo
    zip: FileInfo | None
    source: SourceRanges | None = None


def shard_files(shard: ShardInfo) -> list[ShardFile]:
    """The files a shard consists of (meta first for split formats, then data)."""
    files = [ShardFile(shard.raw_data, shard.zip_data, shard.source)]
    if shard.raw_meta is not None:
        files.insert(0, ShardFile(shard.raw_meta, shard.zip_meta))
    return files


def cache_path(local: str, split: str | None, name: str) -> str:
    """Where the file ``name`` (an index's basename, ``/``-separated) of a stream whose cache
    folder is ``local`` (and ``split``) lives: the one rule, for the engine and the readers."""
    root = os.path.join(local, split) if split else local
    return os.path.join(root, *name.split("/"))


def is_installed(path: str, size: int) -> bool:
    """Whether a shard's file is in place at ``path`` with its index's ``size`` (a ``stat``),
    as the engine's scan finds an installed shard: what a reader on the node may ask before
    its lease resolves (its shard is then a moment away), never a promise the agent made."""
    return _size_is(path, size)


@dataclass
class ShardCache:
    """Residency and accounting of the shards of one index in one local directory.

    Args:
        index: the dataset's index.
        root: the local directory of this split (``local`` or ``local/split``).
        limit: ``cache_limit`` in bytes, or None for no limit.
        keep_zip: keep the compressed files too (they count against the limit).
        local_only: there is no remote: the files are the user's, never evicted.
        pinned_at_once: how many shards consumers may hold pinned at the same time;
            the limit must fit those plus one being installed.
    """

    index: Index
    root: str
    limit: int | None = None
    keep_zip: bool = False
    local_only: bool = False
    pinned_at_once: int = 1
    entries: Entries = field(init=False)
    used: int = field(init=False, default=0)
    stale_markers: list[Marker] = field(init=False, default_factory=list)
    orphan_markers: list[Marker] = field(init=False, default_factory=list)
    _tick: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.entries = Entries(len(self.index.shards))
        if self.limit is not None and not self.local_only and self.index.shards:
            largest = int(columns_of(self.index).footprints(self.keep_zip or self.local_only).max())
            needed = largest * (self.pinned_at_once + 1)
            if self.limit < needed:
                raise CacheError(
                    f"cache_limit={self.limit} bytes is too small for {self.root}: the largest shard "
                    f"takes {largest} bytes{' (with keep_zip)' if self.keep_zip else ''}, and "
                    f"{self.pinned_at_once} shard(s) in use plus one downloading need {needed}; "
                    "raise cache_limit or use smaller shards"
                )

    # -- layout -------------------------------------------------------------------------------
    def path(self, info: FileInfo | str) -> str:
        """The local path of a file of this dataset."""
        return cache_path(self.root, None, info if isinstance(info, str) else info.basename)

    def raw_path(self, i: int) -> str:
        """Where shard ``i``'s (decompressed) data file lives once ready."""
        return self.path(self.index.shards[i].raw_data)

    def footprint(self, i: int) -> int:
        """Bytes shard ``i`` occupies on disk once installed."""
        total = 0
        for f in shard_files(self.index.shards[i]):
            total += f.raw.bytes
            if f.zip is not None and (self.keep_zip or self.local_only):
                total += f.zip.bytes
        return total

    # -- residency ----------------------------------------------------------------------------
    def scan(self, trust_unsynced: bool = True) -> list[int]:
        """Mark shards whose files are already on disk with the right sizes as ready.

        Runs once at start (in an executor). With ``trust_unsynced=False`` (the engine
        does not fsync), a file last written before this machine booted may have lost
        data in a power cut despite its size: such shards are marked ``suspect`` and are
        checked (or fetched again) before use. Whatever the setting, so are shards that a
        run fsyncing in the background renamed before a power cut may have stopped it
        (its marker predates this boot; see :mod:`astream._cache.durability`); those
        markers are kept in ``stale_markers``. Returns the indices found ready.
        """
        booted = boot_time()
        boot = 0.0 if trust_unsynced else booted
        # Markers of runs that fsynced in the background and may have lost power before
        # finishing (see astream._cache.durability): what they covered is suspect too.
        # Where the boot time is unknown, any marker might predate a power cut.
        markers = find_markers(self.root)
        self.stale_markers = [m for m in markers if not booted or m.ctime < booted]
        # Markers of this boot whose run is gone (crashed): their files are complete.
        self.orphan_markers = [m for m in markers if m not in self.stale_markers and not pid_alive(m.pid)]
        covered_from = min((m.ctime for m in self.stale_markers), default=None)
        found: list[int] = []
        if _holds_no_shard(self.root):
            return found  # (a first start: no shard's name made, none stat'ed, at a million shards ~10 s)
        shards = self.index.shards
        # A mapped index names each shard's files without making the shard (at a million
        # shards in one agent, making each was most of its start).
        raw_files = getattr(shards, "raw_files", None) or (lambda i: [
            (f.raw.basename, f.raw.bytes, None if f.zip is None else f.zip.basename, -1 if f.zip is None else f.zip.bytes)
            for f in shard_files(shards[i])])
        for i in range(len(shards)):
            files = raw_files(i)
            stats = [_stat_if_size(self.path(name), size) for name, size, _, _ in files]
            if all(st is not None for st in stats):
                entry = self.entries[i]
                # (as _disk_size counts it: the raw files, and a compressed copy kept beside)
                disk = sum(size + (zsize if zname is not None and _size_is(self.path(zname), zsize) else 0)
                           for _, size, zname, zsize in files)
                entry.found(disk, any(st is not None and st.st_mtime < boot for st in stats) or (
                    covered_from is not None
                    and any(st is not None and st.st_ctime >= covered_from - CTIME_SLACK for st in stats)
                ))
                self.used += entry.size
                found.append(i)
        return found

    def on_disk(self, i: int) -> bool:
        """Whether shard ``i``'s files are on disk with the sizes its index gives (a ``stat``
        each): a ready shard whose file a cleaner or a user removed is not served."""
        return all(_stat_if_size(self.path(f.raw), f.raw.bytes) is not None for f in shard_files(self.index.shards[i]))

    def vanished(self, i: int) -> bool:
        """Shard ``i`` is ready but its files are not on disk as the index describes them:
        forget it (what is left of it is removed; its pins stay) and return True."""
        if self.entries[i].state is not State.READY or self.on_disk(i):
            return False
        if not self.local_only:
            self.delete_files(i)
        self.forget(i)
        return True

    def _disk_size(self, i: int) -> int:
        total = 0
        for f in shard_files(self.index.shards[i]):
            total += f.raw.bytes
            if f.zip is not None and _size_is(self.path(f.zip), f.zip.bytes):
                total += f.zip.bytes
        return total

    def touch(self, i: int) -> None:
        self._tick += 1
        self.entries[i].last_used = self._tick

    def pin(self, i: int) -> None:
        self.entries[i].pins += 1
        self.touch(i)

    def unpin(self, i: int) -> None:
        entry = self.entries[i]
        if entry.pins <= 0:
            raise CacheError(f"shard {i} of {self.root} is not pinned; unpin() called once too often")
        entry.pins -= 1
        self.touch(i)

    def begin(self, i: int) -> None:
        """Shard ``i`` starts being installed: reserve its footprint."""
        entry = self.entries[i]
        entry.begin_install(self.footprint(i))
        self.used += entry.size

    def done(self, i: int) -> None:
        """Shard ``i`` is installed: account what is really on disk."""
        entry = self.entries[i]
        actual = self._disk_size(i) if self.local_only else self.footprint(i)
        self.used += actual - entry.size
        entry.installed(actual)

    def forget(self, i: int) -> None:
        """Shard ``i`` is gone (failed install, or evicted): release its bytes."""
        self.used -= self.entries[i].forget()

    def make_room(
        self, need: int, next_use: Callable[[int], float] | None = None, soon: Callable[[int], bool] | None = None
    ) -> list[int] | None:
        """Evict unpinned shards until ``need`` more bytes fit; None if they cannot.

        Args:
            need: bytes about to be reserved.
            next_use: positions until the node next reads a shard (the plan's look-ahead);
                None: evict the least recently used first.
            soon: shards a prefetch may not evict (read before the one it fetches).
        """
        if self.local_only:
            return []
        if self.limit is None or self.used + need <= self.limit:
            return []
        candidates = [
            Candidate(i, e.size, e.last_used, pinned=e.pins > 0,
                      next_use=None if next_use is None else next_use(i), soon=soon is not None and soon(i))
            for i, e in self.entries.touched()
            if e.state is State.READY
        ]
        victims = choose_victims(candidates, self.used, need, self.limit)
        for i in victims or ():
            self.delete_files(i)
            self.forget(i)
        return victims

    def delete_files(self, i: int) -> None:
        """Remove shard ``i``'s files from disk (raw and compressed)."""
        for f in shard_files(self.index.shards[i]):
            for info in (f.raw, f.zip):
                if info is not None:
                    try:
                        os.unlink(self.path(info))
                    except FileNotFoundError:
                        pass
                    except OSError as exc:
                        raise CacheError(f"cannot evict {self.path(info)}: {exc}") from exc

    @property
    def pinned(self) -> list[int]:
        return [i for i, e in self.entries.touched() if e.pins > 0]


# What astream itself keeps in a cache folder besides shards (and unsynced-run markers).
_OWN = (INDEX_NAME, ORIGIN_NAME, PLAN_FOLDER)


def _holds_no_shard(root: str) -> bool:
    """Whether ``root`` holds nothing but what astream keeps there besides shards (the index,
    its binary form, the origin record, markers, plan states): then no shard is on disk.
    Anything else, a sub-folder or an unknown name, says maybe (the shards are scanned)."""
    try:
        with os.scandir(root) as it:
            for entry in it:
                name = entry.name
                if not (name in _OWN or name.startswith((MARKER_PREFIX, f".{INDEX_NAME}.astream-v"))):
                    return False
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def boot_time() -> float:
    """When this machine booted (seconds since the epoch; 0 where unknown)."""
    try:
        with open("/proc/stat", "rb") as fh:
            for line in fh:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def _stat_if_size(path: str, size: int) -> os.stat_result | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st if st.st_size == size else None


def _size_is(path: str, size: int) -> bool:
    try:
        return os.stat(path).st_size == size
    except OSError:
        return False
