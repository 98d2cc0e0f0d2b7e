"""Cold passes from the cloud emulators: astream against the client libraries and obstore.

Starts gcp-storage-emulator and Azurite (in memory) on 127.0.0.1, writes one MDS dataset
(``--size-mb`` of 1 MiB samples, ``--shard-mb`` shards, uncompressed) into each with
``MDSWriter(out="gs://..." / "azure://...")`` (timed), then, each a fresh process per round:

- ``astream``: one epoch of ``Loader(StreamingDataset(remote=..., storage_options=...))``
  over an empty cache (the downloads, and an iteration that costs little beside them);
- ``library``: the client library's own streaming download of every shard to a file,
  ``--concurrency`` in flight (gcloud-aio-storage ``download_stream``, azure-storage-blob
  ``download_blob().readinto``);
- ``obstore``: the Rust object_store bindings' streams, where obstore is installed.

    python benchmarks/remote_bench.py --size-mb 160 --runs 5
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from _harness import Bench, Metric, fmt, parser, ratio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the emulators' helpers
from storage.emulators import azurite_command, azurite_connection_string

from astream.testing import free_port

HOST = "127.0.0.1"
SECONDS = Metric("seconds", lambda r: r["result"]["seconds"], higher=False, spec=".2f")
CPU = Metric("CPU s", lambda r: r["proc"]["cpu_s"], higher=False, spec=".2f")


def _wait(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((HOST, port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing on {HOST}:{port}")


def emulators() -> tuple[list[subprocess.Popen[bytes]], str, str]:
    gport, aport = free_port(), free_port()
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [subprocess.Popen([sys.executable, "-m", "gcp_storage_emulator", "start", "--host", HOST, "--port",
                               str(gport), "--in-memory", "--default-bucket", "bench", "-q"], **quiet)]
    command = azurite_command()
    if command is None:
        raise SystemExit("Azurite not found: run `make azurite` (needs npm)")
    procs.append(subprocess.Popen([command, "--inMemoryPersistence", "--skipApiVersionCheck", "--loose",
                                   "--blobHost", HOST, "--blobPort", str(aport)], **quiet))
    _wait(gport)
    _wait(aport)
    return procs, f"http://{HOST}:{gport}", f"http://{HOST}:{aport}"


def upload(out: str, options: dict[str, object], size_mb: int, shard_mb: int) -> float:
    import numpy as np

    from astream import MDSWriter

    rng, start = np.random.default_rng(0), time.perf_counter()
    with MDSWriter(out=out, columns={"x": f"ndarray:uint8:{1 << 20}"}, size_limit=f"{shard_mb}mb",
                   storage_options=options, max_workers=4) as writer:
        for _ in range(size_mb):
            writer.write({"x": rng.integers(0, 255, 1 << 20, dtype=np.uint8)})
    return time.perf_counter() - start


def main() -> None:
    p = parser(__doc__, "remotes", runs=5)
    p.add_argument("--size-mb", type=int, default=160)
    p.add_argument("--shard-mb", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=8)
    args = p.parse_args()
    bench = Bench("remotes", args)
    procs, gcs, azure = emulators()
    try:
        conn = azurite_connection_string(azure)
        from azure.storage.blob import BlobServiceClient

        BlobServiceClient.from_connection_string(conn).create_container("bench")
        remotes = {"gcs": ("gs://bench/ds", {"endpoint_url": gcs, "anonymous": True}, gcs, gcs),
                   "azure": ("azure://bench/ds", {"connection_string": conn}, conn, azure)}
        size_mb = max(1, int(args.size_mb * args.scale))
        uploads = {}
        for kind, (root, options, library_endpoint, obstore_endpoint) in remotes.items():
            uploads[kind] = upload(root, options, size_mb, args.shard_mb)
            bench.add({"remote": kind}, "astream", "remotes", "astream_epoch",
                      {"remote": root, "local": "{cache}", "storage_options": options})
            bench.add({"remote": kind}, "library", "remotes", "client_pass",
                      {"client": "library", "kind": kind, "endpoint": library_endpoint, "dest": "{cache}",
                       "concurrency": args.concurrency})
            try:
                import obstore  # noqa: F401

                bench.add({"remote": kind}, "obstore", "remotes", "client_pass",
                          {"client": "obstore", "kind": kind, "endpoint": obstore_endpoint, "dest": "{cache}",
                           "concurrency": args.concurrency})
            except ImportError:
                pass
        bench.run()
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
    if "base" in bench.codes:
        bench.report_ab([SECONDS, CPU])
        return
    rows = []
    for config in bench.configs():
        mine = bench.median(config, "astream", SECONDS)
        for side in ("astream", "library", "obstore"):
            got = bench.median(config, side, SECONDS)
            if got is not None:
                rows.append([config["remote"], side, fmt(got, ".2f"), fmt(size_mb * 1.048576 / got, ",.0f"),
                             fmt(bench.median(config, side, CPU), ".2f"),
                             "" if side == "astream" else fmt(ratio(mine, got, False), ".2f") + "x"])
    bench.table(f"{size_mb} x 1 MiB in {args.shard_mb} MB shards (upload: " + ", ".join(
        f"{k} {v:.1f} s" for k, v in uploads.items()) + f"); {args.concurrency} in flight; medians of {args.runs}, "
        f"load {bench.loads()}", ["remote", "side", "seconds", "MB/s", "CPU s", "astream vs it"], rows)


if __name__ == "__main__":
    main()
