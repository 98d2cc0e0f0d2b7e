"""The unchanged torch idiom, ``DataLoader(StreamingDataset(...), batch_size=B, num_workers=W)``
(issue 31, item 4): MosaicML's order without torch workers, a stop at the first item naming
``astream.Loader`` with them, never a silent map-style read of ``0..len-1``.

The detection is tested without torch too (a stand-in ``torch.utils.data`` whose callers
are functions compiled under torch's module names); the rest needs torch, a test-only
dependency, as tests/adapters/test_torch.py does. The acceptance test runs a MosaicML
training script (``scripts/train.py``) with only its imports changed, one process per rank,
against the orders mosaicml-streaming 0.13 recorded (tests/fixtures/orders/e2e.json).
"""

from __future__ import annotations

import abc
import json
import os
import subprocess
import sys
import time
import types
import uuid
from pathlib import Path
from typing import Any

import pytest
from run_example import to_astream

from astream import Loader, MDSWriter, Stream, StreamingDataset
from astream.errors import ConfigError, UsageError

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
N = 103


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("torch") / "ds"
    with MDSWriter(out=str(out), columns={"id": "int"}, size_limit=1 << 10) as writer:
        for i in range(N):
            writer.write({"id": i})
    return out


def _as_torch(module: str, body: str) -> Any:
    """A function defined in a module named ``module``, as torch's own callers are."""
    namespace: dict[str, Any] = {"__name__": module}
    exec(compile(body, f"<{module}>", "exec"), namespace)
    return namespace["call"]


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A stand-in ``torch.utils.data``: an ABC ``IterableDataset`` and ``get_worker_info``."""

    class IterableDataset(abc.ABC):  # noqa: B024  (torch's is an ABC without abstract methods too)
        pass

    data = types.ModuleType("torch.utils.data")
    data.IterableDataset = IterableDataset  # type: ignore[attr-defined]
    data.worker = None  # type: ignore[attr-defined]
    data.get_worker_info = lambda: data.worker  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.utils.data", data)
    return data


def test_astream_never_imports_torch(data: Path) -> None:
    code = ("import sys; from astream import Loader, StreamingDataset; ds = StreamingDataset(local=sys.argv[1], "
            "batch_size=4, shuffle=True); n = sum(1 for _ in ds) + sum(len(b['id']) for b in Loader(ds)); "
            "len(ds); print(n, 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code, str(data)], capture_output=True, text=True, check=True)
    assert result.stdout.split() == [str(2 * N), "False"]


def test_without_torch_workers_the_dataset_is_iterated_in_its_order(data: Path, fake_torch: types.ModuleType) -> None:
    ds = StreamingDataset(local=str(data), batch_size=5, shuffle=True)
    assert isinstance(ds, fake_torch.IterableDataset)  # registered: torch iterates it, never indexes it
    fetch = _as_torch("torch.utils.data._utils.fetch", "def call(ds):\n    return iter(ds)\n")
    got = [int(s["id"]) for s in fetch(ds)]
    assert got == [int(i) for b in Loader(StreamingDataset(local=str(data), batch_size=5, shuffle=True)) for i in b["id"]]
    assert got != list(range(N))
    assert sorted(got) == list(range(N))


def test_in_a_torch_worker_iteration_stops_naming_the_loader(data: Path, fake_torch: types.ModuleType) -> None:
    fake_torch.worker = types.SimpleNamespace(id=0, num_workers=2)  # type: ignore[attr-defined]
    fetch = _as_torch("torch.utils.data._utils.fetch", "def call(ds):\n    return iter(ds)\n")
    with pytest.raises(UsageError, match=r"DataLoader\(ds, num_workers=2\).*Change that one line to "
                                         r"astream\.Loader\(ds, batch_size=5, num_workers=2\)"):
        fetch(StreamingDataset(local=str(data), batch_size=5))
    fake_torch.worker = None  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"without batch_size.*MosaicML refuses this too"):
        fetch(StreamingDataset(local=str(data)))
    # Not torch: iterating without batch_size (batch size 1) and with it, as before.
    assert sum(1 for _ in StreamingDataset(local=str(data))) == N


def test_a_torch_sampler_asking_len_is_refused(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sampler_len = _as_torch("torch.utils.data.sampler", "def call(ds):\n    return len(ds)\n")
    distributed_len = _as_torch("torch.utils.data.distributed", "def call(ds):\n    return len(ds)\n")
    monkeypatch.delitem(sys.modules, "torch.utils.data", raising=False)
    before = StreamingDataset(local=str(data), batch_size=5)  # made before torch was imported
    with pytest.raises(UsageError, match=r"map-style .*0\.\.len-1.*torch was imported after the StreamingDataset "
                                         r"was made.*astream\.Loader\(ds, batch_size=5"):
        sampler_len(before)

    class IterableDataset(abc.ABC):  # noqa: B024
        pass

    data_module = types.ModuleType("torch.utils.data")
    data_module.IterableDataset = IterableDataset  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.utils.data", data_module)
    after = StreamingDataset(local=str(data), batch_size=5)
    with pytest.raises(UsageError, match=r"a torch sampler .* was given; StreamingDataset shuffles and splits"):
        distributed_len(after)
    assert len(after) == N  # anyone else asks as before


@pytest.mark.parametrize("workers", [0, 2])
def test_the_node_agent_thread_is_stopped_before_the_interpreter_finalizes(data: Path, tmp_path: Path,
                                                                           workers: int) -> None:
    # A lingering in-thread agent fired its idle timer into a finalized interpreter from its
    # uvloop thread: a segfault at exit in about one torch training run in ten.
    code = ("import atexit, sys, threading\nfrom astream import Loader, StreamingDataset\n"
            "def check():\n"
            "    print('agents', sum(t.name == 'astream-agent' and t.is_alive() for t in threading.enumerate()))\n"
            "atexit.register(check)  # (registered first: runs after astream's own exit hooks)\n"
            "ds = StreamingDataset(remote=sys.argv[1], local=sys.argv[2], batch_size=5, shuffle=True)\n"
            "print(sum(len(b['id']) for b in Loader(ds, batch_size=5, num_workers=int(sys.argv[3]))))\n")
    result = subprocess.run([sys.executable, "-c", code, str(data), str(tmp_path / "cache"), str(workers)],
                            capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.split() == [str(N), "agents", "0"]


# -- with torch ------------------------------------------------------------------------------

def test_dataloader_without_workers_reads_mosaicmls_order_and_resumes(data: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    def make() -> StreamingDataset:
        return StreamingDataset(local=str(data), batch_size=5, shuffle=True, shuffle_seed=11)

    want = [[b["id"].tolist() for b in Loader(make(), batch_size=5)] for _ in range(1)]
    ds = make()
    loader = DataLoader(ds, batch_size=5)
    epochs = [[b["id"].tolist() for b in loader] for _ in range(2)]
    assert epochs[0] == want[0]
    assert epochs[0] != epochs[1]  # the next epoch, reshuffled
    assert all(isinstance(b, list) for b in epochs[0])
    assert isinstance(next(iter(DataLoader(make(), batch_size=5)))["id"], torch.Tensor)

    # Composer's checkpoint: the dataset's state after k batches, loaded into a fresh run.
    ds = make()
    taken = []
    for batch in DataLoader(ds, batch_size=5):
        taken.append(batch["id"].tolist())
        if len(taken) == 4:
            break
    state = ds.state_dict(num_samples=4 * 5, from_beginning=False)
    resumed = make()
    resumed.load_state_dict(state)
    assert taken + [b["id"].tolist() for b in DataLoader(resumed, batch_size=5)] == want[0]


def test_dataloader_with_workers_stops_at_the_first_item_with_the_fix(data: Path) -> None:
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    ds = StreamingDataset(local=str(data), batch_size=5, shuffle=True)
    start = time.monotonic()
    with pytest.raises(UsageError, match=r"astream\.Loader\(ds, batch_size=5, num_workers=2\)"):
        next(iter(DataLoader(ds, batch_size=5, num_workers=2)))
    assert time.monotonic() - start < 60
    with pytest.raises(ValueError, match="expected unspecified shuffle option"):  # torch's own, as for MosaicML's
        DataLoader(ds, batch_size=5, shuffle=True)


def test_torch_imported_after_the_dataset_stops_before_a_map_style_read(data: Path) -> None:
    pytest.importorskip("torch")
    code = ("import sys; from astream import StreamingDataset; ds = StreamingDataset(local=sys.argv[1], batch_size=5)\n"
            "import torch\nfrom torch.utils.data import DataLoader\n"
            "for workers in (0, 2):\n"
            "    try:\n        next(iter(DataLoader(ds, batch_size=5, num_workers=workers)))\n"
            "    except Exception as e:\n        print(type(e).__name__, 'torch was imported after' in str(e))\n"
            "    else:\n        print('read')\n")
    result = subprocess.run([sys.executable, "-c", code, str(data)], capture_output=True, text=True, timeout=120,
                            check=True)
    assert result.stdout.split() == ["UsageError", "True", "UsageError", "True"]


# -- acceptance: a MosaicML training script, only its imports changed, on 2 ranks ----------

def _case(fixtures_dir: Path, name: str) -> dict[str, Any]:
    cases = json.loads((fixtures_dir / "orders" / "e2e.json").read_text())["cases"]
    return next(c for c in cases if c["name"] == name)


def _train(tmp_path: Path, case: dict[str, Any], num_workers: int, *, fix: bool = False,
           timeout: float = 240) -> list[subprocess.CompletedProcess[str]]:
    """Run scripts/train.py with its imports changed (and, with ``fix``, the one line the
    error names changed as it says), a process per rank as torchrun starts them."""
    cfg = case["cfg"]
    layouts = REPO / "tests" / "fixtures" / "mds" / "layouts"
    source = to_astream((HERE / "scripts" / "train.py").read_text())
    if fix:
        line = ('    loader = DataLoader(dataset, batch_size=config["batch_size"], '
                'num_workers=config["num_workers"])\n')
        assert line in source
        source = source.replace(line, line.replace("DataLoader(dataset", "astream.Loader(dataset"))
        source = source.replace("import json\n", "import json\n\nimport astream\n", 1)
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "train.py"
    script.write_text(source)
    keys = ("shuffle", "shuffle_algo", "shuffle_seed", "num_canonical_nodes", "shuffle_block_size",
            "partition_algo", "batch_size", "epoch_size")
    config = {
        "streams": [{"remote": str(layouts / s["layout"]), "local": str(tmp_path / "cache" / f"s{i}"),
                     **({"proportion": s["proportion"]} if "proportion" in s else {})}
                    for i, s in enumerate(cfg["streams"])],
        "dataset": {k: cfg[k] for k in keys if k in cfg},
        "batch_size": cfg["batch_size"], "num_workers": num_workers, "epochs": len(case["epochs"]),
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    ranks = cfg["world"]["ranks_per_node"]
    assert cfg["world"]["num_physical_nodes"] == 1
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(ranks), "TORCHELASTIC_RUN_ID": uuid.uuid4().hex}
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "config.json"), str(tmp_path / f"r{r}.json")],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(ranks)]
    results = []
    try:
        for r, proc in enumerate(procs):
            out, err = proc.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
            if proc.returncode == 0:
                results[-1].stdout = (tmp_path / f"r{r}.json").read_text()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return results


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_mosaicml_training_script_trains_on_mosaicmls_samples_on_two_ranks(fixtures_dir: Path,
                                                                              tmp_path: Path) -> None:
    pytest.importorskip("torch")
    case = _case(fixtures_dir, "mixture_proportions")  # 2 ranks, DataLoader without workers
    results = _train(tmp_path, case, num_workers=0)
    for rank, result in enumerate(results):
        assert result.returncode == 0, result.stderr[-3000:]
        got = json.loads(result.stdout)
        assert got["len"] == case["epochs"]["0"]["per_rank_len"][rank]
        for epoch, ids in enumerate(got["epochs"]):
            assert ids == case["epochs"][str(epoch)]["per_rank_order"][rank], f"rank {rank}, epoch {epoch}"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_with_torch_workers_it_stops_at_once_and_the_named_fix_trains_in_mosaicmls_order(
    fixtures_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    start = time.monotonic()
    for result in _train(tmp_path / "as-is", _case(fixtures_dir, "mixture_proportions"), num_workers=2):
        assert result.returncode != 0
        assert "Change that one line to astream.Loader(ds, batch_size=6, num_workers=2)" in result.stderr
    assert time.monotonic() - start < 120
    case = _case(fixtures_dir, "dataloader_2workers_py1br")  # recorded with DataLoader(num_workers=2)
    (result,) = _train(tmp_path / "fixed", case, num_workers=2, fix=True)
    assert result.returncode == 0, result.stderr[-3000:]
    for epoch, ids in enumerate(json.loads(result.stdout)["epochs"]):
        assert ids == case["epochs"][str(epoch)]["per_rank_order"][0], f"epoch {epoch}"


def test_stream_objects_of_the_script_are_astreams(tmp_path: Path) -> None:
    # (the script's only change: its imports)
    source = (HERE / "scripts" / "train.py").read_text()
    changed = [line for line in to_astream(source).splitlines() if line not in source.splitlines()]
    assert changed == ["from astream import Stream, StreamingDataset"]
    assert Stream.__module__ == "astream"
