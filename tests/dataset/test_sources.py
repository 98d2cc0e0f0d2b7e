"""The source seam against fakes: each source, the race, the policy (no Loader, no agent, no server)."""

from __future__ import annotations

import asyncio
import os
import shutil
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from astream import MDSWriter
from astream._cache.install import temp_name
from astream._dataset.layout import SampleMap
from astream._dataset.read.arriving import ArrivingShards
from astream._dataset.read.peek import RemotePeek
from astream._dataset.read.policy import ARRIVING, DECODED, RANGED, SourcePolicy
from astream._dataset.read.ranged import RangedReader, hint_options
from astream._dataset.read.shards import OpenShards
from astream._dataset.read.sources import DecodedOffers, InstalledFile, race
from astream._format.index import Index
from astream._format.shard import ShardReader
from astream._storage.base import StorageOptions, Transient, with_retries
from astream._storage.retry import RetryPolicy
from astream.errors import DownloadError

N = 400


def _write(root: Path, **kwargs: Any) -> Path:
    with MDSWriter(out=str(root), columns={"id": "int64", "b": "bytes"}, size_limit="16kb", **kwargs) as w:
        for i in range(N):
            w.write({"id": i, "b": bytes([i % 251]) * 100})
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("src"))


def _smap(root: Path) -> SampleMap:
    return SampleMap([Index.load(root / "index.json")], allow_unsafe_types=False)


def _stream(cache: Path, remote: str | None = "http://remote.invalid/ds", **kwargs: Any) -> SimpleNamespace:
    return SimpleNamespace(remote=remote, split=None, local_dir=str(cache), validate_hash=kwargs.get("validate_hash"))


def _policy(root: Path, cache: Path, *, network: bool = True, **kwargs: Any) -> SourcePolicy:
    return SourcePolicy(_smap(root), [_stream(cache, **kwargs)], [StorageOptions()], network=network)


def _ids(records: Any, offsets: np.ndarray) -> list[int]:
    return records.get_batch(offsets)["id"].tolist()  # type: ignore[no-any-return]


# -- the race -----------------------------------------------------------------------------


def test_the_attempt_first_serves_and_the_lease_first_cancels_it() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        lease: asyncio.Future[str] = loop.create_future()

        async def quick() -> dict[int, Any]:
            return {0: "records"}

        assert await race(quick(), [lease]) == {0: "records"}
        started = asyncio.Event()

        async def slow() -> dict[int, Any]:
            started.set()
            await asyncio.sleep(10)
            raise AssertionError("not cancelled")

        loop.call_later(0.01, lease.set_result, "/installed")
        assert await race(slow(), [lease]) is None  # the installed file was first
        assert started.is_set()

    asyncio.run(main())


def test_an_attempt_that_fails_or_gives_up_leaves_the_batch_to_the_lease() -> None:
    async def main() -> None:
        lease: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def gives_up() -> None:
            return None

        async def fails() -> dict[int, Any]:
            raise OSError("gone")

        assert await race(gives_up(), [lease]) is None
        assert await race(fails(), [lease]) is None

    asyncio.run(main())


# -- the installed file and the decodings offered ------------------------------------------


def test_the_installed_file_serves_once_its_lease_gave_its_path(data: Path) -> None:
    smap = _smap(data)
    shards = OpenShards(smap)
    paths: dict[int, str] = {}
    source = InstalledFile(shards, paths)
    offsets = np.array([3, 1, 2], np.int64)

    async def main() -> None:
        assert source.attempt({0: offsets}) is None  # no path yet: the lease is pending
        paths[0] = str(data / smap.indexes[0].shards[0].raw_data.basename)
        attempt = source.attempt({0: offsets})
        assert attempt is not None
        got = await attempt
        assert got is not None
        assert _ids(got[0], offsets) == [3, 1, 2]

    try:
        asyncio.run(main())
    finally:
        shards.close()


def test_a_decoding_offered_serves_and_notes_its_digest(data: Path) -> None:
    smap = _smap(data)
    shards = OpenShards(smap)
    offers = DecodedOffers(smap, shards)
    raw = (data / smap.indexes[0].shards[0].raw_data.basename).read_bytes()
    info = smap.indexes[0].shards[0]

    async def main() -> None:
        assert offers.attempt({0: np.arange(2)}) is None  # nothing offered
        decoded: Future[Any] = Future()
        shards.offer(0, decoded)
        attempt = offers.attempt({0: np.arange(2)})
        assert attempt is not None
        lease: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, decoded.set_result,
                                              (ShardReader(raw, smap.layouts[0], expected_samples=info.samples), 7))
        got = await race(attempt, [lease])
        assert got is not None
        assert _ids(got[0], np.arange(info.samples)) == list(range(info.samples))
        assert offers.digests == {0: 7}
        failed: Future[Any] = Future()
        failed.set_exception(OSError("unreadable"))
        shards.offer(0, failed)
        attempt = offers.attempt({0: np.arange(2)})
        assert attempt is not None
        assert await race(attempt, [lease]) is None  # a failed decoding: the installed file serves

    try:
        asyncio.run(main())
    finally:
        shards.close()


# -- the arriving file ------------------------------------------------------------------------


def test_the_arriving_file_serves_the_records_written_so_far(data: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    policy = _policy(data, cache)
    turns = policy.turns(bounded=False, skips=False)
    assert turns is not None
    raw = (data / "shard.00000.mds").read_bytes()
    arriving = ArrivingShards(policy_smap := _smap(data), turns)
    samples = policy_smap.indexes[0].shards[0].samples
    temp = Path(temp_name(policy.cache_path(0)))

    def arrive(part: bytes) -> None:
        with temp.open("ab") as fh:
            fh.write(part)

    async def main() -> None:
        wanted = {0: np.array([0, 1, samples - 1], np.int64)}
        assert arriving.attempt(wanted) is None  # nothing arriving yet
        arrive(raw[: len(raw) // 2])
        assert arriving.attempt(wanted) is None  # the last record is not there yet
        arrive(raw[len(raw) // 2 :])
        done = arriving.attempt(wanted)
        assert done is not None
        got = await done
        assert got is not None
        assert _ids(got[0], wanted[0]) == [0, 1, samples - 1]
        assert got[0].source == (os.stat(temp).st_dev, os.stat(temp).st_ino)  # its spans' file

    try:
        asyncio.run(main())
    finally:
        arriving.close()


def test_an_arriving_header_that_disagrees_turns_the_shard_off(data: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    policy = _policy(data, cache)
    turns = policy.turns(bounded=False, skips=False)
    assert turns is not None
    arriving = ArrivingShards(_smap(data), turns)
    raw = bytearray((data / "shard.00000.mds").read_bytes())
    raw[4:8] = (0).to_bytes(4, "little")  # the first record's offset: inside the header
    Path(temp_name(policy.cache_path(0))).write_bytes(bytes(raw))
    try:
        assert arriving.records(0, np.array([0], np.int64)) is None
        assert not turns.applies(ARRIVING, 0)
        assert turns.applies(ARRIVING, 1)
    finally:
        arriving.close()


# -- ranged reads -------------------------------------------------------------------------------


class _Remote:
    """A fake ranged reader over a folder: counts requests, can fail."""

    def __init__(self, root: Path, fail: bool = False) -> None:
        self.root = root
        self.fail = fail
        self.reads: list[tuple[int, int]] = []

    async def read_range(self, stream: int, url: str, first: int, stop: int) -> bytes:
        self.reads.append((first, stop))
        if self.fail:
            raise DownloadError(f"{url}: refused")
        return (self.root / url.rsplit("/", 1)[1]).read_bytes()[first:stop]

    async def aclose(self) -> None:
        pass


def test_ranged_reads_serve_records_within_a_quarter_of_a_shard(data: Path, tmp_path: Path) -> None:
    policy = _policy(data, tmp_path / "cache")
    turns = policy.turns(bounded=False, skips=False)
    assert turns is not None
    remote = _Remote(data)
    peek = RemotePeek(_smap(data), turns, remote)  # type: ignore[arg-type]
    samples = _smap(data).indexes[0].shards[0].samples

    async def main() -> None:
        attempt = peek.attempt({0: np.array([5, 2], np.int64)})
        assert attempt is not None
        got = await attempt
        assert got is not None
        assert _ids(got[0], np.array([2, 5])) == [2, 5]
        assert got[0].spans
        assert got[0].source is None
        # Reading on, past a quarter of the shard's bytes: the download is the cheaper way.
        served = 0
        for at in range(6, samples):
            attempt = peek.attempt({0: np.array([at], np.int64)})
            if attempt is None or await attempt is None:
                break
            served += 1
        assert 0 < served < samples // 2
        assert not turns.applies(RANGED, 0)
        await peek.aclose()

    asyncio.run(main())


def test_a_failed_ranged_read_turns_its_shard_off(data: Path, tmp_path: Path) -> None:
    policy = _policy(data, tmp_path / "cache")
    turns = policy.turns(bounded=False, skips=False)
    assert turns is not None
    remote = _Remote(data, fail=True)
    peek = RemotePeek(_smap(data), turns, remote)  # type: ignore[arg-type]

    async def main() -> None:
        attempt = peek.attempt({0: np.array([1], np.int64)})
        assert attempt is not None
        assert await attempt is None
        assert peek.attempt({0: np.array([1], np.int64)}) is None  # not tried again
        assert len(remote.reads) == 1
        assert turns.applies(RANGED, 1)  # (the others still may)

    asyncio.run(main())


def test_an_installed_shard_is_not_read_by_range(data: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    policy = _policy(data, cache)
    turns = policy.turns(bounded=False, skips=False)
    assert turns is not None
    assert turns.applies(RANGED, 0)
    shutil.copy(data / "shard.00000.mds", cache / "shard.00000.mds")
    assert not turns.applies(RANGED, 0)  # its lease is a moment away


def test_the_ranged_reader_reads_a_local_remote_with_the_engines_settings(data: Path) -> None:
    options = StorageOptions(retry=RetryPolicy(retries=5))
    reader = RangedReader([options])
    want = (data / "shard.00000.mds").read_bytes()[10:90]

    async def main() -> None:
        try:
            assert await reader.read_range(0, str(data / "shard.00000.mds"), 10, 90) == want
            assert reader.storage(0, str(data)).options.retry == hint_options(options).retry
        finally:
            await reader.aclose()

    asyncio.run(main())
    assert hint_options(options).retry == replace(options.retry, yield_to_throttle=True)


@pytest.mark.parametrize("throttled", [False, True])
def test_a_hint_yields_to_a_throttling_remote_at_once(throttled: bool) -> None:
    attempts: list[int] = []

    async def attempt(n: int) -> bytes:
        attempts.append(n)
        if n == 0:
            raise Transient("HTTP 503", throttled=throttled)
        return b"ok"

    options = hint_options(StorageOptions(retry=RetryPolicy(retries=2, backoff=0)))
    if throttled:
        with pytest.raises(DownloadError, match="after 1 attempt "):
            asyncio.run(with_retries("http://x/s", attempt, options))
        assert attempts == [0]
    else:
        assert asyncio.run(with_retries("http://x/s", attempt, options)) == b"ok"  # retried as the engine's
        assert attempts == [0, 1]


# -- the policy -----------------------------------------------------------------------------


def test_the_policy_decides_each_source_per_shard_once(data: Path, tmp_path: Path) -> None:
    zipped = _write(tmp_path / "zstd", compression="zstd")
    cache = tmp_path / "cache"
    plain = _policy(data, cache)
    assert plain.arrives(0)
    assert plain.ranged_url(0) == "http://remote.invalid/ds/shard.00000.mds"
    assert plain.cache_path(0) == str(cache / "shard.00000.mds")
    assert plain.decodable(0) is None  # (an MDS shard)
    compressed = _policy(zipped, cache)
    assert compressed.any_arriving
    assert not compressed.any_ranged
    hashed = _policy(data, cache, validate_hash="xxh64")
    assert not hashed.any_arriving
    assert not hashed.any_ranged
    local = _policy(data, cache, remote=None)
    assert not local.any_arriving
    assert not local.any_ranged
    # A loader's worker process: over the network, no ranged reads; from a local folder, yes.
    assert not _policy(data, cache, network=False).any_ranged
    assert _policy(data, cache, network=False, remote=str(data)).any_ranged
    # Per reader: nothing with a bounded cache or in skip mode; each source turns off for good.
    assert plain.turns(bounded=True, skips=False) is None
    assert plain.turns(bounded=False, skips=True) is None
    turns = plain.turns(bounded=False, skips=False)
    assert turns is not None
    assert turns.first_fetch()
    assert not turns.first_fetch()
    assert turns.applies(DECODED, 0)
    assert turns.applies(RANGED, 0)
    turns.stop(RANGED)
    assert not turns.applies(RANGED, 0)
    assert turns.applies(ARRIVING, 0)
    turns.fail(ARRIVING, 0)
    assert not turns.applies(ARRIVING, 0)
    assert turns.applies(ARRIVING, 1)


# -- the order in which a reader tries them (EarlyReads, over fakes) ------------------------


class _Leases:
    """One lease per shard (lease ``g`` holds shard ``g``), resolved by the test."""

    def __init__(self, shard: np.ndarray) -> None:
        self._shard = shard
        n = int(shard.max()) + 1
        self.ready = [asyncio.get_running_loop().create_future() for _ in range(n)]
        self.book = SimpleNamespace(issued=n, shard=np.arange(n), start=np.array(
            [int(np.flatnonzero(shard == g)[0]) for g in range(n)]))

    def pending_in(self, a: int, b: int) -> dict[int, int]:
        return {g: g for g in dict.fromkeys(self._shard[a:b].tolist()) if not self.ready[g].done()}

    async def ready_until(self, b: int) -> None:
        for g in dict.fromkeys(self._shard[:b].tolist()):
            await self.ready[g]


class _Source:
    """An early source that serves at once and counts its attempts."""

    def __init__(self, turns: Any, name: str) -> None:
        self._turns, self._name = turns, name
        self.attempts = 0

    def attempt(self, want: dict[int, np.ndarray]) -> Any:
        if not all(self._turns.applies(self._name, g) for g in want):
            return None
        self.attempts += 1
        done = asyncio.get_running_loop().create_future()
        done.set_result({g: _records(g, self._name) for g in want})
        return done

    def note(self, shard: int, records: Any) -> None:
        pass


def _records(shard: int, name: str) -> Any:
    from astream._dataset.read.records import PeekedRecords

    got = PeekedRecords(None, np.arange(1, dtype=np.int64), [(0, 8, shard)])  # type: ignore[arg-type]
    got.source = None if name == RANGED else (1, shard)
    return got


def test_a_reader_reads_by_range_until_a_batch_comes_from_the_cache(data: Path, tmp_path: Path) -> None:
    from astream._dataset.read.early_reads import EarlyReads
    from astream._dataset.read.ledger import ServedLedger
    from astream._dataset.read.sources import EarlySources

    smap = _smap(data)
    policy = _policy(data, tmp_path / "cache")
    shard = np.repeat(np.arange(3, dtype=np.int64), 4)  # positions 0-3: shard 0, 4-7: 1, 8-11: 2

    async def main() -> None:
        turns = policy.turns(bounded=False, skips=False)
        assert turns is not None
        ranged, arriving = _Source(turns, RANGED), _Source(turns, ARRIVING)
        arriving.attempt = lambda want: None  # type: ignore[method-assign]  # (nothing arrived yet)
        owed: list[int] = []
        checks = SimpleNamespace(ledger=ServedLedger(), owe=lambda lease, g, ready: owed.append(g))
        leases = _Leases(shard)
        early = EarlyReads(smap, shard, shard * 0, leases, checks, OpenShards(smap),  # type: ignore[arg-type]
                           EarlySources(turns, ranged, arriving))  # type: ignore[arg-type]
        got = await early.fetch(0, 4)  # shard 0 still downloading: by range
        assert list(got) == [0]
        assert checks.ledger.owes(0)
        assert owed == [0]
        leases.ready[0].set_result("/cache/0")
        assert await early.fetch(0, 4) == {}  # from the cache: no more ranged reads
        assert not turns.on(RANGED)
        later = asyncio.get_running_loop().call_later(0.05, leases.ready[1].set_result, "/cache/1")
        assert await early.fetch(4, 8) == {}  # waited for its lease, not read by range
        assert ranged.attempts == 1
        later.cancel()
        del arriving.attempt  # (now the arriving file holds them)
        got = await early.fetch(8, 12)
        assert list(got) == [2]
        assert arriving.attempts == 1
        assert owed == [0, 2]

    asyncio.run(main())
