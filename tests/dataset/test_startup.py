"""Scripts that start loader workers at their top level, without a main guard (real scripts
run as subprocesses, real worker processes)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from astream import MDSWriter

BOOTSTRAP = "before the current process has finished its bootstrapping phase"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("startup") / "ds"
    with MDSWriter(root, {"id": "int64", "x": "ndarray:float32:4"}, size_limit=2000) as writer:
        for i in range(96):
            writer.write({"id": i, "x": np.full(4, i, np.float32)})
    return root


def _run(tmp_path: Path, data: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(body))
    env = {**os.environ, "DATA": str(data)}
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120, check=False)


HEAD = """\
    import os
    from astream import Loader, StreamingDataset
    print("top level ran")
"""


def test_a_script_without_main_guard_iterates_with_worker_processes(tmp_path: Path, data: Path) -> None:
    done = _run(tmp_path, data, HEAD + """\
    ds = StreamingDataset(local=os.environ["DATA"], batch_size=8, shuffle=True)
    with Loader(ds, num_workers=2) as loader:
        ids = sorted(i for epoch in range(2) for batch in loader for i in batch["id"].tolist())
    print("samples", len(ids), ids == sorted(list(range(96)) * 2))
    """)
    assert done.returncode == 0, done.stderr
    assert BOOTSTRAP not in done.stderr
    # The workers did not re-run the script: its top level ran once, in the script's process.
    assert done.stdout.count("top level ran") == 1, done.stdout
    assert "samples 192 True" in done.stdout


def test_a_transform_defined_in_an_unguarded_script_fails_once_with_the_fix(tmp_path: Path, data: Path) -> None:
    done = _run(tmp_path, data, HEAD + """\
    def double(sample):
        return {**sample, "x": sample["x"] * 2}

    ds = StreamingDataset(local=os.environ["DATA"], batch_size=8, transform=double)
    for batch in Loader(ds, num_workers=2):
        pass
    """)
    assert done.returncode == 1
    assert BOOTSTRAP not in done.stderr
    assert done.stderr.count("astream.errors.ConfigError:") == 1, done.stderr
    assert "train.py, line 8: this script starts loader worker processes at its top level" in done.stderr
    assert 'if __name__ == "__main__":\n        main()' in done.stderr
    assert done.stdout.count("top level ran") == 1


def test_a_guarded_script_may_define_the_transform(tmp_path: Path, data: Path) -> None:
    done = _run(tmp_path, data, HEAD + """\
    def double(sample):
        return {**sample, "x": sample["x"] * 2}

    def main():
        ds = StreamingDataset(local=os.environ["DATA"], batch_size=8, transform=double)
        xs = [float(x) for batch in Loader(ds, num_workers=2) for x in batch["x"][:, 0]]
        print("sum", sum(xs))

    if __name__ == "__main__":
        main()
    """)
    assert done.returncode == 0, done.stderr
    assert f"sum {2.0 * sum(range(96))}" in done.stdout
    # The forkserver and workers import the guarded script (to find `double`), which prints.
    assert done.stdout.count("top level ran") >= 1


def test_a_guarded_script_the_workers_do_not_need_is_not_imported_again(tmp_path: Path, data: Path) -> None:
    # The workers need nothing of the script: neither the forkserver nor a worker imports it
    # (a training script's imports, its framework's, would be paid before the first worker).
    # Its own code meanwhile reads its globals from the main thread while workers start.
    done = _run(tmp_path, data, HEAD + """\
    def main():
        ds = StreamingDataset(local=os.environ["DATA"], batch_size=8, shuffle=True)
        seen, files = [], set()
        with Loader(ds, num_workers=2) as loader:
            for epoch in range(2):
                for batch in loader:
                    seen.extend(batch["id"].tolist())
                    files.add(__file__)
        print("samples", len(seen), sorted(seen) == sorted(list(range(96)) * 2), len(files))

    if __name__ == "__main__":
        main()
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("top level ran") == 1, done.stdout
    assert "samples 192 True 1" in done.stdout
