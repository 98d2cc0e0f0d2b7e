"""``astream convert``: each input format to MDS, read back with astream (and MosaicML Streaming)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from clikit import Run, assert_one_line_error

from astream import LocalDataset
from astream._format.index import Index
from astream.testing import LoopbackServer


def _jsonl(path: Path, n: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = [
        {"id": i, "text": f"row {i} " + "é" * (i % 5), "score": i / 4, "flag": i % 2 == 0,
         "vec": [i, i + 1], "meta": {"k": i}} for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def _read(out: Path) -> tuple[dict[str, str], list[dict[str, object]]]:
    with LocalDataset(out) as ds:
        return ds.columns, [ds[i] for i in range(len(ds))]


def test_jsonl_in_parallel_parts_keeps_every_row_in_order(cli: Run, tmp_path: Path) -> None:
    rows = _jsonl(tmp_path / "in.jsonl", 2000)
    out = tmp_path / "out"
    result = cli("convert", str(tmp_path / "in.jsonl"), "-o", str(out), "--workers", "2", "--parts", "5",
                 "--compression", "zstd", "--hashes", "xxh64", "--size-limit", "16kb",
                 "--columns", "vec:ndarray:int16:2")
    assert result.returncode == 0, result.stderr
    assert "wrote 2,000 samples" in result.stdout
    columns, read = _read(out)
    assert columns == {"flag": "uint8", "id": "int", "meta": "json", "score": "float64", "text": "str",
                       "vec": "ndarray:int16:2"}
    assert [r["id"] for r in read] == list(range(2000))
    assert read[7]["text"] == rows[7]["text"]
    assert read[7]["meta"] == {"k": 7}
    assert read[7]["score"] == 7 / 4
    assert read[3]["vec"].tolist() == [3, 4]
    assert read[3]["vec"].dtype == np.int16
    # One flat dataset, renumbered in order; no trace of the parts.
    index = Index.load(out / "index.json")
    assert [s.stored.basename for s in index.shards] == [f"shard.{i:05}.mds.zstd" for i in range(len(index.shards))]
    assert sorted(os.listdir(out)) == sorted([s.stored.basename for s in index.shards] + ["index.json"])
    assert len(index.shards) > 5
    assert cli("verify", str(out)).returncode == 0


def test_convert_to_a_remote_uploads_shards_then_the_index(main: Run, tmp_path: Path) -> None:
    rows = _jsonl(tmp_path / "in.jsonl", 400)
    remote = tmp_path / "remote"
    remote.mkdir()
    with LoopbackServer(str(remote), allow_put=True) as server:
        args = ("convert", str(tmp_path / "in.jsonl"), "-o", f"{server.url}/ds", "--size-limit", "8kb",
                "--compression", "gz", "--hashes", "md5")
        result = main(*args)
        assert result.returncode == 0, result.stderr
        puts = [r.path for r in server.log if r.method == "PUT"]
        assert puts[-1] == "ds/index.json"
        assert len(puts) == len(os.listdir(remote / "ds")) > 3
        assert [r["id"] for r in _read(remote / "ds")[1]] == [r["id"] for r in rows]
        assert_one_line_error(main(*args), 2, "already holds a dataset", "--overwrite")


def test_csv_and_tsv_infer_numbers(main: Run, tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text('id,name,price\n1,"x, y",2.5\n2,z,3\n')
    (tmp_path / "b.tsv").write_text("id\tname\tprice\n3\tw\t-1e3\n")
    out = tmp_path / "out"
    result = main("convert", str(tmp_path / "a.csv"), str(tmp_path / "b.tsv"), "-o", str(out), "--format", "csv")
    assert result.returncode == 0, result.stderr
    columns, read = _read(out)
    assert columns == {"id": "int", "name": "str", "price": "float64"}
    assert [(r["id"], r["name"], r["price"]) for r in read] == [(1, "x, y", 2.5), (2, "z", 3.0), (3, "w", -1000.0)]


def test_numpy_folders(main: Run, tmp_path: Path) -> None:
    (tmp_path / "npz").mkdir()
    np.savez(tmp_path / "npz" / "a.npz", x=np.arange(24, dtype=np.float32).reshape(6, 4), y=np.arange(6))
    np.savez(tmp_path / "npz" / "b.npz", x=np.ones((3, 4), np.float32), y=np.arange(6, 9))
    assert main("convert", str(tmp_path / "npz"), "-o", str(tmp_path / "o1")).returncode == 0
    columns, read = _read(tmp_path / "o1")
    assert columns == {"x": "ndarray:float32:4", "y": "int64"}
    assert [int(r["y"]) for r in read] == list(range(9))  # type: ignore[call-overload]
    assert read[1]["x"].tolist() == [4, 5, 6, 7]  # type: ignore[attr-defined]

    (tmp_path / "npy").mkdir()
    np.save(tmp_path / "npy" / "image.npy", np.arange(5 * 6, dtype=np.uint8).reshape(5, 2, 3))
    np.save(tmp_path / "npy" / "label.npy", np.arange(5, dtype=np.int16))
    assert main("convert", str(tmp_path / "npy"), "-o", str(tmp_path / "o2"), "--parts", "2").returncode == 0
    columns, read = _read(tmp_path / "o2")
    assert columns == {"image": "ndarray:uint8:2,3", "label": "int16"}
    assert read[4]["image"].tolist() == np.arange(24, 30).reshape(2, 3).tolist()  # type: ignore[attr-defined]

    np.save(tmp_path / "npy" / "short.npy", np.arange(2))
    assert_one_line_error(main("convert", str(tmp_path / "npy"), "-o", str(tmp_path / "o3")), 1,
                          "different lengths")


def test_parquet(cli: Run, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"a": list(range(900)), "s": [f"s{i}" for i in range(900)],
                      "b": [bytes([i % 256]) for i in range(900)],
                      "f": pa.array([i / 2 for i in range(900)], pa.float32()),
                      "v": pa.array([[i, -i] for i in range(900)], pa.list_(pa.int16(), 2)),
                      "r": [list(range(1 + i % 3)) for i in range(900)]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=100)
    result = cli("convert", str(tmp_path / "t.parquet"), "-o", str(tmp_path / "out"), "--workers", "2",
                 "--columns", "a:int32")
    assert result.returncode == 0, result.stderr
    columns, read = _read(tmp_path / "out")
    assert columns == {"a": "int32", "b": "bytes", "f": "float32", "r": "ndarray:int64", "s": "str",
                       "v": "ndarray:int16:2"}
    assert [(int(r["a"]), r["s"], r["b"]) for r in read] == [(i, f"s{i}", bytes([i % 256])) for i in range(900)]  # type: ignore[call-overload]
    assert [float(r["f"]) for r in read[:3]] == [0.0, 0.5, 1.0]  # type: ignore[arg-type]
    assert read[5]["v"].tolist() == [5, -5]  # type: ignore[attr-defined]
    assert [r["r"].tolist() for r in read[:3]] == [[0], [0, 1], [0, 1, 2]]  # type: ignore[attr-defined]


def test_parquet_without_pyarrow_names_the_extra(cli: Run, tmp_path: Path) -> None:
    blocker = tmp_path / "blocker" / "pyarrow"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('pyarrow is not installed (test)')\n")
    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    result = cli("convert", str(tmp_path / "t.parquet"), "-o", str(tmp_path / "out"),
                 env={"PYTHONPATH": str(tmp_path / "blocker")})
    assert_one_line_error(result, 1, "pyarrow", "astream[convert]")


def test_bad_arguments_exit_2(cli: Run, main: Run, tmp_path: Path) -> None:
    _jsonl(tmp_path / "in.jsonl", 10)
    src, out = str(tmp_path / "in.jsonl"), str(tmp_path / "out")
    assert_one_line_error(cli("convert", src), 2, "--out")
    assert_one_line_error(main("convert", src, "-o", out, "--columns", "nope"), 2, "NAME:ENCODING")
    assert_one_line_error(main("convert", src, "-o", out, "--columns", "ghost:int"), 2, "ghost")
    assert_one_line_error(main("convert", src, "-o", out, "--columns", "id:int99"), 2, "int99")
    assert_one_line_error(main("convert", src, "-o", out, "--compression", "lzma"), 2, "lzma")
    assert_one_line_error(main("convert", src, "-o", out, "--hashes", "crc7"), 2, "crc7")
    assert_one_line_error(main("convert", src, "-o", out, "--size-limit", "big"), 2, "size_limit")
    assert_one_line_error(main("convert", src, "-o", out, "--workers", "0"), 2, "--workers")
    (tmp_path / "notes.txt").write_text('{"a": 1}\n')
    assert_one_line_error(main("convert", str(tmp_path / "notes.txt"), "-o", out), 2, "--format")
    assert not os.path.exists(out)
    assert main("convert", str(tmp_path / "notes.txt"), "-o", str(tmp_path / "o2"), "--format", "jsonl").returncode == 0
    assert main("convert", src, "-o", out).returncode == 0
    assert_one_line_error(main("convert", src, "-o", out), 2, "--overwrite")
    assert main("convert", src, "-o", out, "--overwrite").returncode == 0


def test_bad_input_rows_name_the_row_and_leave_no_dataset(cli: Run, main: Run, tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    _jsonl(src, 300)  # more rows than the encodings are inferred from
    with src.open("a") as fh:
        fh.write('{"id": "fifty", "text": "x", "score": 1, "flag": true, "vec": [], "meta": {}}\n')
    out = tmp_path / "out"
    result = cli("convert", str(src), "-o", str(out), "--workers", "2", "--parts", "2")
    assert_one_line_error(result, 1, "in.jsonl at byte", "'id'", "--columns id:")
    assert not (out / "index.json").exists()
    assert not (out / ".astream-parts").exists()
    (tmp_path / "broken.jsonl").write_text('{"id": 1}\n{"id": \n')
    assert_one_line_error(main("convert", str(tmp_path / "broken.jsonl"), "-o", str(tmp_path / "o2")), 1,
                          "broken.jsonl at byte 10", "not a JSON line")
    assert_one_line_error(main("convert", str(tmp_path / "absent.jsonl"), "-o", str(tmp_path / "o3")), 1,
                          "absent.jsonl")


PEER_READ = """
import json, sys, types
m = types.ModuleType("streaming.vision"); m.__path__ = []
sys.modules.setdefault("streaming.vision", m)
from streaming.base.dataset import StreamingDataset
ds = StreamingDataset(local=sys.argv[1], batch_size=1, shuffle=False)
print(json.dumps([[int(ds[i]["id"]), ds[i]["text"], ds[i]["vec"].tolist()] for i in range(len(ds))]))
"""


@pytest.mark.peer
def test_mosaicml_streaming_reads_a_parallel_conversion(cli: Run, tmp_path: Path) -> None:
    """Run where mosaicml-streaming is installed (the peer venv); skipped elsewhere."""
    # Only looked up: importing it here would load torch into the test process for nothing.
    if importlib.util.find_spec("streaming") is None:
        pytest.skip("mosaicml-streaming is not installed")
    rows = _jsonl(tmp_path / "in.jsonl", 300)
    out = tmp_path / "out"
    result = cli("convert", str(tmp_path / "in.jsonl"), "-o", str(out), "--workers", "2", "--parts", "3",
                 "--compression", "zstd", "--hashes", "sha1", "--size-limit", "4kb", "--columns", "vec:ndarray:int64")
    assert result.returncode == 0, result.stderr
    read = subprocess.run([sys.executable, "-c", PEER_READ, str(out)], capture_output=True, text=True,
                          check=True, timeout=120, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert json.loads(read.stdout) == [[r["id"], r["text"], r["vec"]] for r in rows]
