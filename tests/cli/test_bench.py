"""``astream bench``: streams a served dataset and reports throughput and the cache's hit rate."""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import urllib.request
from pathlib import Path

import pytest
from clikit import NUM_SAMPLES, Run, assert_one_line_error

from astream.cli._harness import Server, checkouts, peers
from astream.cli._harness.au import largest
from astream.cli._harness.bench import Bench, Metric
from astream.cli._output import CommandError
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


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_compare_quick_against_astream_alone(main: Run, dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = main("bench", "compare", "--quick", "--data", str(dataset), "--out", str(out), "--peers",
                  "--work", str(tmp_path / "work"))
    assert result.returncode == 0, result.stderr
    assert "| your dataset, warm, 0 workers (samples/s) |" in result.stdout
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert lines[0]["kind"] == "machine"
    runs = [line for line in lines if line["kind"] == "run"]
    assert {r["side"] for r in runs} == {"astream", "raw"}  # no peer, the transfer floor
    for r in runs:
        if r["side"] == "astream" and r["config"]["group"] == "warm":
            assert r["result"]["epochs"][0]["samples"] == NUM_SAMPLES  # every sample, in a fresh process
            assert r["proc"]["peak_rss_mb"] > 10
            assert r["code"] == str(Path(__file__).resolve().parents[2])  # this checkout's astream
    summary = lines[-1]
    assert summary["kind"] == "compare"
    assert summary["peers"] == []
    rows = {row["what"]: row for row in summary["rows"]}
    warm = rows["your dataset, warm, 2 workers"]
    assert warm["values"]["astream"] > 0
    assert warm["faster_peer"] is None
    assert rows["your dataset, cold over loopback: the epoch"]["floor"] > 0
    assert 0 < rows["your dataset, cold: resume at 90 %, first batch"]["values"]["astream"] < 60
    pytest.importorskip("matplotlib")
    assert summary["charts"] == [str(out / "throughput.png"), str(out / "cold.png")]
    for chart in summary["charts"]:
        assert Path(chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_compare_errors(main: Run, tmp_path: Path) -> None:
    assert_one_line_error(main("bench", "compare", "--data", str(tmp_path / "absent")), 2, "no such folder")
    assert_one_line_error(main("bench", "compare", "--data", str(tmp_path), "--out", str(tmp_path / "o")), 2,
                          "no index.json")
    assert_one_line_error(main("bench", "compare", "--workers", "0"), 2, "--workers")


def test_the_accelerator_search_finds_the_largest_passing_n() -> None:
    for limit in range(0, 40):
        tried: list[int] = []

        def passes(n: int, limit: int = limit, tried: list[int] = tried) -> bool:
            tried.append(n)
            return n <= limit

        assert largest(passes, 32) == min(limit, 32)
        assert len(tried) == len(set(tried))  # never the same N twice
        assert len(tried) <= 12


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_paired_ab_runs_each_side_from_its_own_checkout(dataset: Path, tmp_path: Path) -> None:
    base = tmp_path / "base"
    shutil.copytree(Path(checkouts.THIS) / "astream", base / "astream")
    args = argparse.Namespace(runs=2, data=str(tmp_path / "data"), json=str(tmp_path / "ab.jsonl"), base=str(base),
                              head=None, quiet=True)
    bench = Bench("ab", args)
    bench.add({"case": 1}, "astream", "mds", "stream", {"lib": "astream", "remote": str(dataset), "local": "{cache}"})
    records = bench.run()
    assert [(r["round"], r["side"]) for r in records] == [(0, "astream"), (0, "base"), (1, "base"), (1, "astream")]
    assert {r["side"]: r["code"] for r in records} == {"astream": checkouts.THIS, "base": str(base)}
    assert all(r["result"]["epochs"][0]["samples"] == NUM_SAMPLES for r in records)
    bench.report_ab([Metric("samples/s", lambda r: r["result"]["epochs"][0]["samples"])])
    lines = [json.loads(line) for line in (tmp_path / "ab.jsonl").read_text().splitlines()]
    assert [line["kind"] for line in lines] == ["machine", "run", "run", "run", "run", "summary"]
    assert lines[-1]["rows"][0][4] == "1.000x"  # the same samples on both sides


def test_a_base_is_a_checkout_or_a_commit(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match=r"no astream/__init__\.py"):
        checkouts.resolve(str(tmp_path), tmp_path)
    if not (Path(checkouts.THIS) / ".git").exists():
        pytest.skip("not a git checkout")
    with pytest.raises(CommandError, match="rev-parse"):
        checkouts.resolve("no-such-ref-anywhere", tmp_path)
    extracted = Path(checkouts.resolve("HEAD", tmp_path))
    assert (extracted / "astream" / "__init__.py").is_file()
    assert extracted.parent == tmp_path / "checkouts"
    assert checkouts.resolve("HEAD", tmp_path) == str(extracted)  # extracted once


def test_a_peer_is_found_where_it_was_put(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASTREAM_BENCH_PEERS", str(tmp_path))
    monkeypatch.delenv("ASTREAM_LITDATA_PYTHON", raising=False)
    if importlib.util.find_spec("litdata") is not None:
        pytest.skip("litdata is importable here")
    assert peers.find("litdata", {}) is None
    (tmp_path / "litdata" / "bin").mkdir(parents=True)
    assert peers.find("litdata", {}) is None  # half made: not found
    (tmp_path / "litdata" / ".astream-bench-complete").touch()
    assert peers.find("litdata", {}) == str(tmp_path / "litdata" / "bin" / "python")
    monkeypatch.setenv("ASTREAM_LITDATA_PYTHON", sys.executable)
    assert peers.find("litdata", {}) == sys.executable
    assert peers.find("litdata", {"litdata": sys.executable}) == sys.executable
    with pytest.raises(CommandError, match="cannot run"):
        peers.find("litdata", {"litdata": str(tmp_path / "absent")})
    with pytest.raises(CommandError, match="no peer 'torchdata'"):
        peers.find("torchdata", {})


def test_the_server_process_serves_and_logs(dataset: Path) -> None:
    with Server(dataset.parent) as server:
        url = server.url(dataset)
        assert server.s3(dataset) == f"s3://{dataset.name}"
        with urllib.request.urlopen(f"{url}/index.json") as resp:
            assert json.loads(resp.read())["shards"]
        assert ("GET", f"{dataset.name}/index.json", None) in server.requests()  # (paths without the leading /)


def test_a_failing_peer_leaves_its_cell_empty_and_astream_stops_the_run(dataset: Path, tmp_path: Path) -> None:
    args = argparse.Namespace(runs=1, data=str(tmp_path / "data"), json=None, base=None, head=None, quiet=True,
                              peer_python=[("hf", shutil.which("false"))])
    bench = Bench("fail", args)
    bench.add({"case": 1}, "hf", "mds", "stream", {"lib": "astream", "remote": None, "local": str(dataset)})
    bench.add({"case": 1}, "astream", "mds", "stream", {"lib": "astream", "remote": str(dataset), "local": "{cache}"})
    assert [r["side"] for r in bench.run()] == ["astream"]
    bench.cases = []
    bench.add({"case": 2}, "astream", "mds", "stream", {"lib": "astream", "remote": str(tmp_path / "absent"),
                                                        "local": "{cache}"})
    with pytest.raises(CommandError, match=r"fail astream \{'case': 2\} failed \(exit 1\): .*absent"):
        bench.run()
