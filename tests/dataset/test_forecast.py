"""``astream plan`` and the epoch forecast (issue #20) against real bounded-cache runs.

The forecast builds the plan from index.json alone and plays it through the cache's own
policy simulation; with no prefetch beyond the current batch a real run's transfers are
deterministic, so the forecast must match them exactly: downloads, bytes over the
network (stored, i.e. compressed, sizes), evictions and re-downloads.
"""

from __future__ import annotations

import asyncio
import json
import time
import warnings
from pathlib import Path

import aiohttp
import pytest

from astream import Loader, MDSWriter, StreamingDataset
from astream._cache.eviction import min_cache_bytes
from astream._cache.simulation import SimTrace
from astream._format.index import Index
from astream._node.room import footprints
from astream._sampling.forecast import forecast_epoch, stall_timeline
from astream.cli import build_parser, main
from astream.cli._plan import forecast
from astream.errors import CacheError, CacheWarning, ConfigError
from astream.testing import LoopbackServer

SAMPLES = 300
BATCH = 4


def write(root: Path, compression: str | None) -> Index:
    with MDSWriter(out=str(root), columns={"id": "int64", "x": "bytes"}, size_limit="8kb",
                   compression=compression) as w:
        for i in range(SAMPLES):
            w.write({"id": i, "x": bytes([i % 251]) * 500 + bytes(range(i % 200, 200)) * 2})
    return Index.load(root / "index.json")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("remote")
    indexes = {c or "none": write(root / (c or "none"), c) for c in (None, "zstd")}
    with LoopbackServer(str(root)) as server:
        yield server, indexes


def plan_args(location: str, *extra: str) -> object:
    return build_parser().parse_args(["plan", location, "--batch-size", str(BATCH), "--shuffle-seed", "3", *extra])


@pytest.mark.parametrize(("algo", "scale", "codec"), [("py1e", 1.0, "none"), ("py1br", 3.0, "none"),
                                                      ("py1s", 1.5, "zstd")])
def test_forecast_matches_a_real_run_exactly(served: tuple[LoopbackServer, dict[str, Index]], tmp_path: Path,
                                             algo: str, scale: float, codec: str) -> None:
    server, indexes = served
    index = indexes[codec]
    limit = int(min_cache_bytes(footprints(index, False), BATCH, 1) * scale)
    args = plan_args(f"{server.url}/{codec}", "--shuffle-algo", algo, "--cache-limit", str(limit),
                     "--predownload", str(BATCH))
    predicted = forecast(index, args).nodes[0]  # type: ignore[arg-type]
    assert predicted.evictions > 0  # the limit bites
    ds = StreamingDataset(remote=f"{server.url}/{codec}", local=str(tmp_path / "cache"), batch_size=BATCH,
                          shuffle=True, shuffle_algo=algo, shuffle_seed=3, cache_limit=limit, predownload=BATCH)
    before = len(server.log)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        loader = Loader(ds)
        planned = [int(i) for b in loader.batch_ids(0) for i in b]
        assert [int(i) for b in loader for i in b["id"]] == planned
        stats = loader.stats()
    ds.close()
    gets = sum(1 for r in server.log[before:] if r.method == "GET" and ".mds" in r.path and r.range is None)
    assert gets == stats.shards_downloaded == predicted.downloads
    assert stats.evictions == predicted.evictions
    assert stats.redownloads == predicted.redownloads
    assert stats.epoch_bytes_downloaded == predicted.bytes_downloaded
    assert stats.peak_cache_bytes <= limit
    assert predicted.peak_cache_bytes <= limit


def test_the_smallest_workable_limit_is_the_one_the_dataset_enforces(
    served: tuple[LoopbackServer, dict[str, Index]], tmp_path: Path
) -> None:
    server, indexes = served
    least = forecast(indexes["none"], plan_args(server.url, "--workers", "2")).min_cache_limit  # type: ignore[arg-type]
    ds = StreamingDataset(remote=f"{server.url}/none", local=str(tmp_path / "cache"), batch_size=BATCH, shuffle=True,
                          cache_limit=least - 1)
    with pytest.raises(CacheError, match=rf"needs at least {least} bytes"):
        next(iter(Loader(ds, num_workers=2, worker_mode="thread")))
    ds.close()
    with pytest.raises(CacheError, match=rf"below the {least} bytes 2 reader"):
        forecast(indexes["none"], plan_args(server.url, "--workers", "2", "--cache-limit", str(least - 1)))  # type: ignore[arg-type]


def test_stall_timeline_by_hand() -> None:
    # Shard 0 for step 0, shard 1 for steps 1 and 2; 100 bytes each at 100 B/s, 0.5 s steps.
    trace = SimTrace(downloads=[[0], [1], []], evictions=[0, 0, 0], held=[100, 200, 200], keys=[[0], [1], [1]])
    # step 0 arrives at 1.0 (waited 1.0); step 1 is asked for at 1.0, its shard arrives at
    # 2.0, the loop asks at 1.5 (waits 0.5); step 2 is ready at once; the epoch ends at 3.0
    assert stall_timeline(trace, [100, 100], bandwidth=100.0, step_time=0.5) == (1.5, 3.0)
    # shard 1 prefetched during step 0: it arrives at 2.0 all the same (one link)
    early = SimTrace(downloads=[[0, 1], [], []], evictions=[0, 0, 0], held=[200] * 3, keys=[[0], [1], [1]])
    assert stall_timeline(early, [100, 100], bandwidth=100.0, step_time=0.5) == (1.5, 3.0)
    # a slower loop hides the second transfer entirely
    assert stall_timeline(early, [100, 100], bandwidth=100.0, step_time=1.0) == (1.0, 4.0)
    # each transfer costing 0.5 s more: 1.5 s for step 0, step 1 ready at 3.0 (asked at 2.0)
    assert stall_timeline(trace, [100, 100], bandwidth=100.0, step_time=0.5, latency=0.5) == (2.5, 4.0)
    with pytest.raises(ConfigError, match="bandwidth must be > 0"):
        stall_timeline(trace, [100, 100], bandwidth=0.0, step_time=0.5)


def test_more_cache_fewer_downloads_and_a_perfect_one_downloads_each_shard_once(
    served: tuple[LoopbackServer, dict[str, Index]]
) -> None:
    _, indexes = served
    index = indexes["none"]
    sizes = footprints(index, False)
    from astream.sampling import EpochPlan

    plan = EpochPlan([{"shard_sizes": index.shard_sizes}], shuffle=True, shuffle_seed=3, batch_size=BATCH)
    least = min_cache_bytes(sizes, BATCH, 1)
    figures = [forecast_epoch(plan, sizes, cache_limit=int(least * f), predownload=BATCH).nodes[0].downloads
               for f in (1, 2, 4)]
    assert figures == sorted(figures, reverse=True)
    whole = forecast_epoch(plan, sizes, cache_limit=None).nodes[0]
    assert (whole.downloads, whole.evictions, whole.redownloads) == (len(sizes), 0, 0)
    assert whole.peak_cache_bytes == sum(sizes)
    ordered = forecast_epoch(EpochPlan([{"shard_sizes": index.shard_sizes}], batch_size=BATCH), sizes)
    # in order, a batch spans one or two shards: far from a uniform draw
    assert ordered.shuffle_quality < 0.5 < forecast_epoch(plan, sizes).shuffle_quality


def test_the_command(served: tuple[LoopbackServer, dict[str, Index]], capsys: pytest.CaptureFixture[str],
                     tmp_path: Path) -> None:
    server, indexes = served
    location = f"{server.url}/zstd"
    assert main(["plan", location, "--batch-size", "4", "--world", "2x2", "--cache-limit", "100kb",
                 "--bandwidth", "1mb", "--step-time", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "shuffle quality" in out
    assert "re-downloads" in out
    assert "stall" in out
    assert main(["plan", location, "--batch-size", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["nodes"][0]["downloads"] == len(indexes["zstd"].shards)
    assert data["nodes"][0]["bytes_downloaded"] == sum(s.stored.bytes for s in indexes["zstd"].shards)
    assert main(["plan", location, "--batch-size", "4", "--world", "2"]) == 2
    assert "--world='2' is not NODESxRANKS" in capsys.readouterr().err
    assert main(["plan", location, "--batch-size", "4", "--bandwidth", "1mb"]) == 2
    assert "--bandwidth and --step-time go together" in capsys.readouterr().err


def test_the_picture(served: tuple[LoopbackServer, dict[str, Index]], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    server, _ = served
    png = tmp_path / "plan.png"
    assert main(["plan", f"{server.url}/none", "--batch-size", "4", "--cache-limit", "100kb", "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_throttled_loopback_server_shares_one_link(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).write_bytes(bytes(100_000))

    async def fetch_both(url: str) -> list[bytes]:
        async with aiohttp.ClientSession() as session:

            async def one(name: str) -> bytes:
                async with session.get(f"{url}/{name}") as resp:
                    return await resp.read()

            return list(await asyncio.gather(one("a"), one("b")))

    with LoopbackServer(str(tmp_path), bandwidth=1_000_000) as server:
        start = time.perf_counter()
        bodies = asyncio.run(fetch_both(server.url))
        took = time.perf_counter() - start
    assert bodies == [bytes(100_000)] * 2
    assert took >= 0.2 * 0.95  # 200 kB through one 1 MB/s link, whatever the concurrency (a lower bound)
    with pytest.raises(ValueError, match="bandwidth must be > 0"):
        LoopbackServer(str(tmp_path), bandwidth=0)
