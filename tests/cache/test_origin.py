"""Whose cache a folder is (``astream._cache.origin``): issue 31 item 1, issue 32 finding 3."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from astream._cache.origin import ORIGIN_NAME, claim_folder, read_origin
from astream.errors import CacheError, ConfigError

OTHER_UID = 65534  # nobody


def test_the_first_remote_claims_the_folder_and_another_is_refused(tmp_path: Path) -> None:
    local = str(tmp_path / "cache")
    claim_folder(local, "http://a.example/ds", None)
    assert read_origin(local) == "http://a.example/ds"
    claim_folder(local, "http://a.example/ds/", None)  # the same remote, spelt with a slash
    with pytest.raises(ConfigError, match="Reused local directory") as refused:
        claim_folder(local, "http://b.example/ds", None)
    assert "http://a.example/ds" in str(refused.value)
    assert "http://b.example/ds" in str(refused.value)


def test_splits_are_folders_of_their_own(tmp_path: Path) -> None:
    local = str(tmp_path / "cache")
    claim_folder(local, "http://a.example/ds", "train")
    claim_folder(local, "http://b.example/other", "val")  # another folder: no conflict
    assert read_origin(os.path.join(local, "train")) == "http://a.example/ds/train"
    with pytest.raises(ConfigError, match="Reused local directory"):
        claim_folder(local, "http://b.example/other", "train")


def test_a_dataset_without_a_remote_or_read_in_place_claims_nothing(tmp_path: Path) -> None:
    claim_folder(str(tmp_path), None, None)
    claim_folder(str(tmp_path), str(tmp_path), None)
    assert not (tmp_path / ORIGIN_NAME).exists()


def test_a_folder_that_is_not_ours_to_write_is_left_unclaimed(tmp_path: Path) -> None:
    folder = tmp_path / "copy"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):  # root writes anyway: check the read-only file system case instead
            pytest.skip("this user writes into a 0555 folder (root): a read-only mount is not available here")
        claim_folder(str(folder), "http://a.example/ds", None)
        assert read_origin(str(folder)) is None
    finally:
        folder.chmod(0o755)


def test_a_marker_that_is_not_ours_is_refused_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / ORIGIN_NAME).write_text(json.dumps(["not", "a", "record"]))
    with pytest.raises(CacheError, match="delete it"):
        claim_folder(str(tmp_path), "http://a.example/ds", None)


def test_two_processes_claiming_for_two_remotes_at_once_one_wins(tmp_path: Path) -> None:
    local = str(tmp_path / "race")
    code = ("import sys; from astream._cache.origin import claim_folder\n"
            "try:\n    claim_folder(sys.argv[1], sys.argv[2], None)\nexcept Exception as e:\n"
            "    print(type(e).__name__); sys.exit(3)\n")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    procs = [subprocess.Popen([sys.executable, "-c", code, local, f"http://{name}.example/ds"], env=env,
                              stdout=subprocess.PIPE, text=True) for name in ("a", "b", "c", "d")]
    said = [p.communicate(timeout=60)[0] for p in procs]
    codes = [p.returncode for p in procs]
    winner = read_origin(local)
    assert winner in {f"http://{n}.example/ds" for n in "abcd"}
    for code, out, name in zip(codes, said, "abcd", strict=True):
        assert (code == 0) == (winner == f"http://{name}.example/ds"), out
        assert code == 0 or out.strip() == "ConfigError"


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make a folder of another user (uid 65534)")
def test_a_folder_of_another_user_is_refused_as_a_cache(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, OTHER_UID, OTHER_UID)
    with pytest.raises(ConfigError, match="belongs to uid 65534"):
        claim_folder(str(theirs), "http://a.example/ds", None)
    claim_folder(str(theirs), None, None)  # their dataset, read in place: no cache, no refusal


def _as_other_user(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", f"import os, sys; os.setgid({OTHER_UID}); os.setuid({OTHER_UID})\n"
                           + code, *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def shared_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary folder every user writes (as /tmp, where it is made: pytest's own is
    private to this user), made the default cache's parent."""
    base = Path(tempfile.mkdtemp(prefix="astream-shared-", dir=tempfile.gettempdir()))
    base.chmod(0o1777)
    monkeypatch.delenv("ASTREAM_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_default_cache_is_per_user_and_private(shared_tmp: Path) -> None:
    from astream._dataset.stream import default_cache_dir

    local = default_cache_dir("http://a.example/ds")
    assert os.path.dirname(local) == str(shared_tmp / f"astream-{os.getuid()}")
    claim_folder(local, "http://a.example/ds", None, default=True)
    for folder in (os.path.dirname(local), local):
        info = os.lstat(folder)
        assert info.st_uid == os.getuid()
        assert info.st_mode & 0o777 == 0o700


def test_xdg_cache_home_holds_the_default_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from astream._dataset.stream import default_cache_dir

    monkeypatch.delenv("ASTREAM_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    local = default_cache_dir("http://a.example/ds")
    assert os.path.dirname(local) == str(tmp_path / "xdg" / "astream")
    claim_folder(local, "http://a.example/ds", None, default=True)
    assert os.stat(local).st_mode & 0o777 == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run as another user (uid 65534)")
def test_another_user_can_neither_read_nor_fill_the_default_cache(shared_tmp: Path) -> None:
    from astream._dataset.stream import default_cache_dir

    local = default_cache_dir("http://a.example/ds")
    claim_folder(local, "http://a.example/ds", None, default=True)
    probe = ("try:\n    os.listdir(sys.argv[1])\nexcept PermissionError:\n    print('refused')\n"
             "try:\n    open(os.path.join(sys.argv[1], 'shard.00000.mds'), 'wb')\nexcept PermissionError:\n"
             "    print('refused')\n")
    other = _as_other_user(probe, local)
    assert other.stdout.split() == ["refused", "refused"], other.stderr


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run as another user (uid 65534)")
@pytest.mark.parametrize("planted", ["folder", "symlink"])
def test_a_default_cache_another_user_made_first_is_refused(shared_tmp: Path, planted: str) -> None:
    from astream._dataset.stream import default_cache_dir

    local = default_cache_dir("http://a.example/ds")
    base = os.path.dirname(local)
    decoy = shared_tmp / "decoy"
    made = _as_other_user("os.mkdir(sys.argv[2], 0o777)\n" if planted == "folder" else
                          "os.mkdir(sys.argv[1], 0o777); os.symlink(sys.argv[1], sys.argv[2])\n", str(decoy), base)
    assert made.returncode == 0, made.stderr
    with pytest.raises(ConfigError, match="default cache folder") as refused:
        claim_folder(local, "http://a.example/ds", None, default=True)
    assert ("symlink" if planted == "symlink" else "belongs to uid 65534") in str(refused.value)
