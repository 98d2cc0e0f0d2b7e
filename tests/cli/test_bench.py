"""``astream bench``: streams a served dataset and reports throughput and the cache's hit rate."""

from __future__ import annotations

import json
from pathlib import Path

from clikit import NUM_SAMPLES, Run, assert_one_line_error

from astream.testing import LoopbackServer


def test_bench_cold_then_warm(cli: Run, main: Run, dataset: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with LoopbackServer(str(dataset)) as server:
        cold = cli("bench", server.url, "--local", str(cache), "--batch-size", "10", "--json")
        assert cold.returncode == 0, cold.stderr
        result = json.loads(cold.stdout)
        shards = len(json.loads((dataset / "index.json").read_text())["shards"])
        assert result["samples"] == NUM_SAMPLES
        assert result["batches"] == NUM_SAMPLES // 10
        assert result["samples_per_s"] > 0
        assert result["first_batch_s"] <= result["seconds"]
        assert result["shards_downloaded"] == shards
        assert result["bytes_downloaded"] == sum(p.stat().st_size for p in dataset.glob("shard.*"))
        assert result["cache_hit_rate"] == 0.0
        assert result["peak_rss_bytes"] > 10 << 20
        fetched = server.count("shard.*")

        warm = main("bench", server.url, "--local", str(cache), "--batch-size", "10", "--shuffle", "--limit", "95",
                    "--workers", "2")
        assert warm.returncode == 0, warm.stderr
        assert "100.0% hit rate" in warm.stdout
        assert "100 samples in 10 batches" in warm.stdout  # --limit stops at the end of a batch
        assert "samples/s" in warm.stdout
        assert server.count("shard.*") == fetched  # nothing downloaded again


def test_bench_a_local_dataset_with_workers_leaves_it_untouched(main: Run, dataset: Path) -> None:
    before = sorted(p.name for p in dataset.iterdir())
    result = main("bench", str(dataset), "--batch-size", "30", "--workers", "2", "--worker-mode", "thread", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["samples"] == NUM_SAMPLES
    assert sorted(p.name for p in dataset.iterdir()) == before  # decompressed into a temporary cache


def test_bench_simulates_an_accelerator(main: Run, dataset: Path) -> None:
    result = main("bench", str(dataset), "--batch-size", "10", "--step-time", "0.002", "--json")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["step_time_s"] == 0.002
    # it slept (NUM_SAMPLES / 10 - 1) steps of at least 2 ms: the wall time holds them
    assert figures["seconds"] >= (NUM_SAMPLES // 10 - 1) * 0.002
    assert 0.0 < figures["accelerator_utilisation"] <= 1.0
    assert 0.0 <= figures["stall"] <= 1.0
    assert figures["wait_p50_s"] <= figures["wait_p99_s"]
    text = main("bench", str(dataset), "--batch-size", "10", "--step-time", "0.001")
    assert "accelerator " in text.stdout
    assert "next() waits" in text.stdout
    assert_one_line_error(main("bench", str(dataset), "--step-time", "-1"), 2, "--step-time")


def test_bench_errors(cli: Run, main: Run, dataset: Path) -> None:
    assert_one_line_error(cli("bench", str(dataset), "--batch-size", "0"), 2, "--batch-size")
    assert_one_line_error(main("bench", str(dataset), "--workers", "-1"), 2, "--workers")
    assert_one_line_error(main("bench", str(dataset), "--cache-limit", "lots"), 2, "cache_limit")
    with LoopbackServer(str(dataset)) as server:
        assert_one_line_error(main("bench", f"{server.url}/absent", "--local", str(dataset.parent / "c")), 1,
                              "absent/index.json")
        (dataset / "index.json").write_text('{"version": 2, "shards": 7}')
        assert_one_line_error(main("bench", server.url), 1, "index.json", "shards")
