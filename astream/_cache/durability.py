"""Durable shards without waiting for the disk: fsync after the rename, guarded by a marker.

With ``fsync=True`` the engine hands a shard to the consumer as soon as its file is
renamed into place, and fsyncs it on a helper thread afterwards. The invariant this
module keeps is the one ``fsync`` exists for: **no later run ever trusts a file that a
power cut may have torn.** A process crash cannot tear a file (its final name appears by
rename, after the last write, and the page cache survives the process); only a power cut
(or kernel crash) can, and only for a file whose data had not reached the disk yet.

How the window between rename and fsync is covered:

1. Before the first rename of a run, an empty *marker* file
   ``<root>/.astream-unsynced.<pid>.<hex>`` is created and made durable (fsync of the
   file and of ``root``). Every later rename of this run happens after that, so every
   file this run renames has a change time (``st_ctime``: rename updates it) at or after
   the marker's.
2. Each renamed file is fdatasync'ed on the helper thread.
3. When the engine closes, it waits for those fsyncs, fsyncs the directories the renames
   happened in (so the renames themselves are on disk), and only then removes the marker.
   If anything failed, the marker stays.

A later run (:meth:`ShardCache.scan`, with :func:`find_markers`) finds markers whose
change time is **before this machine booted**: their run may have been cut off by the
power before its fsyncs finished, so every shard with a file changed at or after such a
marker is ``suspect``: hash-checked against index.json (or fetched again) before use,
exactly like a file written with ``fsync=False`` before the last boot. A marker from
*this* boot is not a risk: no power cut has happened since, so whatever its files hold
is what their writer renamed (complete). Its owner may still be running, or may have
crashed. A live owner's marker is left alone. A crashed owner's marker is *adopted* by
the next run that fsyncs (:meth:`BackgroundSync.adopt`): it fsyncs every file changed
since the marker, then removes it; until then, if the power fails, the run after the
reboot still distrusts those files. A pre-boot marker is removed once the run that found
it has resolved (checked or replaced) every shard it made suspect, see
:meth:`ShardEngine.aclose`.

The argument rests on two assumptions, the same as the ``fsync=False`` boot-time check:
the wall clock does not step backwards across the window, and the filesystem updates a
file's ctime on rename (ext4, XFS, btrfs, tmpfs do). Removing the marker is never
required for safety (a marker that outlives its need only causes extra checks). A run
checks the shards of its own index; files of another index in the same directory are
that index's runs' business (they find the marker too, unless a run of this index
removed it after checking all of its own shards).

Not covered, as before: a run with ``fsync=True`` trusts files that a run with
``fsync=False`` wrote before the last boot (that run leaves no marker).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
from concurrent.futures import Future

from astream._storage.executor import PriorityExecutor
from astream._storage.sink import datasync, fsync_dir

__all__ = ["MARKER_PREFIX", "BackgroundSync", "Marker", "find_markers", "pid_alive"]

MARKER_PREFIX = ".astream-unsynced."
_MARKER = re.compile(r"^\.astream-unsynced\.(\d+)\.[0-9a-f]{8}$")
# Filesystem timestamps are coarse (a clock tick, or a second on some filesystems): a
# file renamed just after the marker was created may carry the same or a slightly lower
# stamp. Anything changed up to this long before a marker counts as covered by it.
CTIME_SLACK = 2.0


class Marker:
    """One marker file found in a cache directory."""

    def __init__(self, path: str, pid: int, ctime: float) -> None:
        self.path = path
        self.pid = pid
        self.ctime = ctime

    def __repr__(self) -> str:
        return f"Marker({self.path!r}, pid={self.pid}, ctime={self.ctime})"


def find_markers(root: str) -> list[Marker]:
    """The unsynced-run markers in ``root`` (not in its sub-directories)."""
    found = []
    with contextlib.suppress(OSError), os.scandir(root) as it:
        for entry in it:
            match = _MARKER.match(entry.name)
            if match is None:
                continue
            with contextlib.suppress(OSError):
                found.append(Marker(entry.path, int(match.group(1)), entry.stat(follow_symlinks=False).st_ctime))
    return found


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (ours always does)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _changed_files(root: str, since: float, max_depth: int = 2) -> list[str]:
    """Regular files under ``root`` changed at or after ``since`` (markers excluded)."""
    out: list[str] = []

    def walk(folder: str, depth: int) -> None:
        with contextlib.suppress(OSError), os.scandir(folder) as it:
            for entry in it:
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        if depth < max_depth:
                            walk(entry.path, depth + 1)
                    elif (entry.is_file(follow_symlinks=False) and not _MARKER.match(entry.name)
                          and entry.stat(follow_symlinks=False).st_ctime >= since):
                        out.append(entry.path)

    walk(root, 1)
    return out


class BackgroundSync:
    """fdatasyncs renamed files on a helper thread, behind a durable marker in ``root``.

    Use: ``await prepare()`` before renaming a file into place (creates the marker once),
    :meth:`submit` the final path right after the rename (any thread), and
    ``await drain()`` when done (waits, fsyncs the directories, removes the marker).
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self.marker = os.path.join(root, f"{MARKER_PREFIX}{os.getpid()}.{os.urandom(4).hex()}")
        self._pool: PriorityExecutor | None = None
        self._prepared: asyncio.Future[None] | None = None
        self._lock = threading.RLock()
        self._pending: set[Future[None]] = set()
        self._folders: set[str] = set()
        self._failed: BaseException | None = None
        self._marker_made = False

    def _thread(self) -> PriorityExecutor:
        # astream's own pool, not concurrent.futures': the interpreter's exit hook stops
        # those before atexit hooks run, and an agent on a thread of the rank closes its
        # engines in one (launch._stop_thread_agents). With a stopped helper the final
        # drain was refused and every job left its marker behind (issue 35).
        with self._lock:
            if self._pool is None:
                self._pool = PriorityExecutor(1, name="astream-fsync")
            return self._pool

    def _make_marker(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        fd = os.open(self.marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._marker_made = True
        fsync_dir(self.root)  # the marker's name is on disk before any rename it covers

    def start_prepare(self) -> None:
        """Begin creating the marker (idempotent); :meth:`prepare` waits for it."""
        if self._prepared is None:
            loop = asyncio.get_running_loop()
            self._prepared = asyncio.ensure_future(loop.run_in_executor(self._thread(), self._make_marker))

    async def prepare(self) -> None:
        """Wait until the marker is durable; renames covered by it may happen after this."""
        self.start_prepare()
        assert self._prepared is not None
        await asyncio.shield(self._prepared)

    def submit(self, path: str) -> None:
        """fdatasync ``path`` soon (callable from any thread, after its rename)."""
        folder = os.path.dirname(path) or "."
        with self._lock:
            self._folders.add(folder)
            future = self._thread().submit(self._sync_file, path)
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: Future[None]) -> None:
        with self._lock:
            self._pending.discard(future)
            exc = None if future.cancelled() else future.exception()
            if exc is not None and self._failed is None:
                self._failed = exc

    @staticmethod
    def _sync_file(path: str) -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return  # evicted (or replaced, and its replacement is submitted on its own)
        try:
            datasync(fd)
        finally:
            os.close(fd)

    def adopt(self, markers: list[Marker]) -> None:
        """Finish the job of crashed runs of this boot: fsync what their markers cover, then drop them.

        No power cut happened since they ran (same boot), so their renamed files are
        complete; once those are on disk the markers have nothing left to guard.
        """
        if not markers:
            return

        def job() -> None:
            for marker in markers:
                files = _changed_files(self.root, marker.ctime - CTIME_SLACK)
                for path in files:
                    self._sync_file(path)
                for folder in sorted({os.path.dirname(p) for p in files} | {self.root}):
                    fsync_dir(folder)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(marker.path)

        with self._lock:
            future = self._thread().submit(job)
            self._pending.add(future)
        future.add_done_callback(self._done)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def _finish(self) -> bool:
        """On the helper thread, after every file's fsync: make renames durable, drop the marker."""
        with self._lock:
            folders, failed = sorted(self._folders), self._failed
        if failed is not None:
            return False
        if not self._marker_made:
            return True  # nothing was renamed under a marker of ours
        for folder in folders:
            fsync_dir(folder)
        if self.root not in folders:
            fsync_dir(self.root)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.marker)
        return True

    async def drain(self) -> bool:
        """Wait for every submitted fsync; then remove the marker unless one failed.

        Returns:
            Whether everything submitted is durable (and the marker is gone).
        """
        if self._pool is None:
            return True
        if self._prepared is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._prepared)
        loop = asyncio.get_running_loop()
        # The helper is one thread: a job queued now runs after every fsync queued before it.
        return await asyncio.shield(loop.run_in_executor(self._pool, self._finish))

    def close(self) -> None:
        """Stop the helper thread (after :meth:`drain`); pending fsyncs still run."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
