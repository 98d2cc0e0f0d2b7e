"""A local copy of a dataset: read when the remote cannot be, refused cleanly when the folder
cannot be written (issue 31 item 7, issue 32 finding 13). The index enters in
``astream._cache.index_file.load_index``; the cases run as a dataset would meet them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from astream import MDSWriter, StreamingDataset
from astream.errors import CacheWarning, DownloadError
from astream.testing import LoopbackServer

OTHER_UID = 65534
N = 120

# Builds a dataset of remote argv[1] in local argv[2] and prints whether it read every sample.
READ = """
import sys
import encodings.idna  # (what is loaded lazily, before a prelude drops to a user who cannot read it)
import astream.testing
from astream import StreamingDataset
{prelude}
try:
    ds = StreamingDataset(remote=sys.argv[1], local=sys.argv[2])
    print('read', sorted(int(s['id']) for s in ds) == list(range({n})))
    ds.close()
except Exception as exc:
    print(type(exc).__name__, exc)
""".replace("{n}", str(N))


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder under the temporary folder that another uid may enter (pytest's is private)."""
    root = Path(tempfile.mkdtemp(prefix="astream-copy-", dir=tempfile.gettempdir()))
    root.chmod(0o755)
    with MDSWriter(out=str(root / "remote"), columns={"id": "int64", "x": "ndarray:uint8:32"},
                   size_limit="1kb") as writer:
        for i in range(N):
            writer.write({"id": i, "x": np.full(32, i % 251, np.uint8)})
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(code: str, *args: str, prelude: str = "") -> str:
    proc = subprocess.run([sys.executable, "-c", code.replace("{prelude}", prelude), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.getcwd(), "TMPDIR": tempfile.gettempdir()})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_a_remote_that_is_gone_reads_the_copy_in_local(shared: Path) -> None:
    local = str(shared / "cache")
    with LoopbackServer(str(shared / "remote")) as server:
        url = server.url
        first = StreamingDataset(remote=url, local=local)
        assert sorted(int(s["id"]) for s in first) == list(range(N))
        first.close()
    # The server is gone (offline): the folder holds index.json and every shard of that remote.
    with pytest.warns(CacheWarning, match="reading the copy of the dataset"):
        again = StreamingDataset(remote=url, local=local)
    try:
        assert sorted(int(s["id"]) for s in again) == list(range(N))  # (before: DownloadError)
    finally:
        again.close()
    with pytest.raises(DownloadError):  # nothing to fall back on
        StreamingDataset(remote=url, local=str(shared / "empty"))


def test_an_index_into_a_full_disk_is_a_cache_error(shared: Path) -> None:
    prelude = ("import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
               "resource.setrlimit(resource.RLIMIT_FSIZE, (80, 80))\n")  # every write past 80 bytes: EFBIG
    with LoopbackServer(str(shared / "remote")) as server:
        said = _run(READ, server.url, str(shared / "cache"), prelude=prelude)
    assert said.startswith("CacheError cannot write"), said  # (before: OSError [Errno 27])
    assert "index.json" in said


def _read_only_copy(shared: Path) -> tuple[Path, str]:
    """A complete copy of the dataset that the reading process cannot write, and how to run as it."""
    copy = shared / "copy"
    shutil.copytree(shared / "remote", copy)
    if os.getuid() == 0:  # root writes anywhere: read as another user, owner of a 0555 copy
        for folder, _, files in os.walk(shared):
            os.chown(folder, OTHER_UID, OTHER_UID)
            for name in files:
                os.chown(os.path.join(folder, name), OTHER_UID, OTHER_UID)
        copy.chmod(0o555)
        return copy, f"import os; os.setgid({OTHER_UID}); os.setuid({OTHER_UID})\n"
    copy.chmod(0o555)
    return copy, ""


def test_a_complete_read_only_copy_is_read(shared: Path) -> None:
    copy, prelude = _read_only_copy(shared)
    try:
        with LoopbackServer(str(shared / "remote")) as server:
            said = _run(READ, server.url, str(copy), prelude=prelude)
        assert said == "read True", said  # (before: PermissionError writing index.json)
        assert not (copy / ".astream-origin.json").exists()
    finally:
        copy.chmod(0o755)


def test_a_read_only_folder_without_an_index_is_a_cache_error(shared: Path) -> None:
    copy, prelude = _read_only_copy(shared)
    try:
        copy.chmod(0o755)
        (copy / "index.json").unlink()
        copy.chmod(0o555)
        with LoopbackServer(str(shared / "remote")) as server:
            said = _run(READ, server.url, str(copy), prelude=prelude)
        assert said.startswith("CacheError cannot write"), said
        assert "read-only" in said
    finally:
        copy.chmod(0o755)
