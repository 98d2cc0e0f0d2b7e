"""Resuming after the mixture changed (issue 36), one process: local MDS streams, a Loader.

Every stream writes ids ``stream * 10_000 + i``, so a batch says which stream and sample
each row is; the orders are checked against the pure plan (astream._sampling.remix).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from astream import MDSWriter
from astream._dataset.dataset import StreamingDataset
from astream._dataset.loader import Loader
from astream._dataset.stream import Stream
from astream.cli import main as cli
from astream.errors import ConfigError, StateError

SIZES = {"a": 400, "b": 400, "c": 300}
BATCH = 10


def write(root: Path, name: str, n: int, base: int) -> Path:
    with MDSWriter(out=str(root / name), columns={"id": "int64"}, size_limit="1kb") as writer:
        for i in range(n):
            writer.write({"id": base + i})
    return root / name


@pytest.fixture(scope="module")
def remotes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mix")
    return {name: write(root, name, n, k * 10_000) for k, (name, n) in enumerate(SIZES.items())}


def dataset(remotes: dict[str, Path], tmp: Path, weights: dict[str, float], **kw) -> StreamingDataset:
    streams = [Stream(remote=str(remotes[n]), local=str(tmp / f"cache-{n}"), proportion=p) for n, p in weights.items()]
    kw.setdefault("epoch_size", 600)
    return StreamingDataset(streams=streams, shuffle=True, batch_size=BATCH, shuffle_seed=7, **kw)


def take(ds: StreamingDataset, batches: int | None = None, state: dict | None = None) -> tuple[list[int], dict]:
    loader = Loader(ds, batch_size=BATCH)
    if state is not None:
        loader.load_state_dict(state)
    out: list[int] = []
    for k, batch in enumerate(loader):
        out += batch["id"].tolist()
        if batches is not None and k + 1 == batches:
            break
    return out, loader.state_dict()


def per_stream(ids: list[int]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for i in ids:
        counts[i // 10_000] = counts.get(i // 10_000, 0) + 1
    return counts


def test_a_changed_mixture_is_refused_by_default(remotes, tmp_path) -> None:
    ds = dataset(remotes, tmp_path, {"a": 0.5, "b": 0.5})
    _, state = take(ds, 20)
    ds.close()
    other = dataset(remotes, tmp_path, {"a": 0.8, "b": 0.2})
    with pytest.raises(StateError, match="another dataset"):
        other.load_state_dict(state)
    other.close()


def test_new_weights_govern_the_rest_of_the_epoch_without_repeats(remotes, tmp_path) -> None:
    ds = dataset(remotes, tmp_path, {"a": 0.5, "b": 0.5})
    seen, state = take(ds, 20)
    ds.close()
    assert state["sample_in_epoch"] == 200
    new = dataset(remotes, tmp_path, {"a": 0.8, "b": 0.2}, on_mixture_change="continue")
    rest, after = take(new, None, state)
    plan = new.plan(epoch=0, sample_in_epoch=200, workers_per_rank=1, batch_size=BATCH)
    seg = plan.segment
    assert seg.wanted.tolist() == [320, 80]
    # Stream a has 400 - (what it gave of the first 200) unseen: it runs short by the rest.
    a_seen = per_stream(seen)[0]
    assert seg.unseen.tolist() == [400 - a_seen, 400 - per_stream(seen)[1]]
    assert len(rest) == 400
    assert not set(seen) & set(rest)
    assert len(set(rest)) == len(rest)
    assert per_stream(rest) == {0: min(320, 400 - a_seen), 1: 400 - min(320, 400 - a_seen)}
    assert after["sample_in_epoch"] == 600
    report = new.stats().mixture
    assert report["changes"] == [200]
    assert report["samples"] == 400
    assert [r["stream"] for r in report["streams"]] == [str(remotes["a"]), str(remotes["b"])]
    assert [r["given"] for r in report["streams"]] == seg.counts.tolist()
    assert report["streams"][0]["weight"] == {"proportion": 0.8}
    # The next epoch is a plain epoch of the new mixture.
    nxt, _ = take(new)
    assert per_stream(nxt) == {0: 480, 1: 120}
    new.close()


def test_added_and_removed_streams_and_a_second_change_resume_exactly(remotes, tmp_path) -> None:
    ds = dataset(remotes, tmp_path, {"a": 0.5, "b": 0.5})
    first, state = take(ds, 10)
    ds.close()
    two = dataset(remotes, tmp_path, {"a": 0.4, "b": 0.2, "c": 0.4}, on_mixture_change="continue")
    second, state2 = take(two, 15, state)
    assert state2["sample_in_epoch"] == 250
    assert 2 in per_stream(second)  # the added stream contributes from its start
    two.close()
    three = dataset(remotes, tmp_path, {"c": 0.5, "a": 0.5}, on_mixture_change="continue", epoch_size=700)
    third, state3 = take(three, 8, state2)
    whole, _ = take(three, None, state2)  # the same state again, to the end
    assert whole[: len(third)] == third
    assert 1 not in per_stream(whole)  # b was removed
    three.close()
    # A state taken after the second change resumes exactly, on a fresh dataset.
    again = dataset(remotes, tmp_path, {"c": 0.5, "a": 0.5}, on_mixture_change="raise", epoch_size=700)
    rest, end = take(again, None, state3)
    assert rest == whole[len(third):]
    assert end["sample_in_epoch"] == 700
    everything = first + second + whole
    assert len(everything) == len(set(everything)) == 700
    assert len(state3["astream_mixtures"]["history"]) == 3
    assert [m["from"] for m in state3["astream_mixtures"]["history"]] == [0, 100, 250]
    again.close()


def test_unchanged_states_keep_mosaicmls_keys_and_old_states_load(remotes, tmp_path) -> None:
    ds = dataset(remotes, tmp_path, {"a": 0.5, "b": 0.5})
    seen, state = take(ds, 5)
    assert {k: state[k] for k in ("epoch", "sample_in_epoch", "num_canonical_nodes", "shuffle_seed",
                                  "initial_physical_nodes")} == {
        "epoch": 0, "sample_in_epoch": 50, "num_canonical_nodes": 1, "shuffle_seed": 7, "initial_physical_nodes": 1}
    assert len(state["astream_mixtures"]["history"]) == 1
    old = {k: v for k, v in state.items() if k != "astream_mixtures"}  # as astream saved it before
    rest, _ = take(ds, None, old)
    assert sorted(seen + rest) == sorted(take(ds)[0][:0] + seen + rest)
    assert len(seen + rest) == 600
    ds.close()
    changed = dataset(remotes, tmp_path, {"a": 0.8, "b": 0.2}, on_mixture_change="continue")
    with pytest.raises(StateError, match="records no mixture"):
        changed.load_state_dict(old)
    changed.close()


def test_a_stream_whose_shards_changed_is_refused_naming_it(remotes, tmp_path) -> None:
    ds = dataset(remotes, tmp_path, {"a": 0.5, "b": 0.5})
    _, state = take(ds, 5)
    ds.close()
    grown = write(tmp_path, "b-grown", 450, 10_000)
    record = state["astream_mixtures"]
    # The same place as the state's stream b: the state is edited to say b lived there.
    b_index = record["history"][0]["weights"][1][0]
    new = StreamingDataset(streams=[Stream(remote=str(remotes["a"]), local=str(tmp_path / "ca"), proportion=0.5),
                                    Stream(remote=str(grown), local=str(tmp_path / "cb"), proportion=0.5)],
                           shuffle=True, batch_size=BATCH, shuffle_seed=7, epoch_size=600,
                           on_mixture_change="continue")
    record["streams"][b_index]["place"] = new.run.mixture.streams[new.run.mixture.mixtures[0].keys[1]].place
    with pytest.raises(StateError, match=f"stream {grown}.*changed since this state was saved"):
        new.load_state_dict(state)
    new.close()


def test_continue_needs_random_batching(remotes, tmp_path) -> None:
    with pytest.raises(ConfigError, match="on_mixture_change='continue'"):
        dataset(remotes, tmp_path, {"a": 0.5, "b": 0.5}, on_mixture_change="continue", batching_method="stratified")
    with pytest.raises(ConfigError, match="on_mixture_change"):
        dataset(remotes, tmp_path, {"a": 0.5, "b": 0.5}, on_mixture_change="ignore")


@pytest.mark.slow
def test_the_state_stays_small_after_a_hundred_changes(remotes, tmp_path) -> None:
    state = None
    sizes = []
    for k in range(100):
        w = 0.2 + 0.6 * (k % 7) / 6
        ds = dataset(remotes, tmp_path, {"a": w, "b": 1 - w}, on_mixture_change="continue", epoch_size=100_000)
        if state is not None:
            ds.load_state_dict(state)
        state = ds.state_dict(num_samples=5, from_beginning=False)
        sizes.append(len(json.dumps(state)))
        ds.close()
    assert len(state["astream_mixtures"]["history"]) == 100
    # Print what issue 36 asks to show: bytes of the JSON state after 1 and 100 changes.
    print(f"state: {sizes[0]} bytes with one mixture, {sizes[1]} after 1 change, {sizes[-1]} after 99 changes")
    assert sizes[-1] < 12_000
    assert np.diff(sizes[1:]).max() < 130  # each change adds its description, nothing per sample


def test_loader_workers_follow_the_changed_plan(remotes, tmp_path) -> None:
    ds = dataset(remotes, tmp_path, {"a": 0.5, "b": 0.5})
    seen, state = take(ds, 20)
    ds.close()
    new = dataset(remotes, tmp_path, {"a": 0.8, "b": 0.2}, on_mixture_change="continue")
    loader = Loader(new, batch_size=BATCH, num_workers=2)
    loader.load_state_dict(state)
    rest = [i for b in loader for i in b["id"].tolist()]
    expected = [i for b in loader.batch_ids(0, 200) for i in b.tolist()]
    # (batch_ids are global sample ids; the rows carry stream * 10_000 + i)
    offsets = {0: 0, 1: SIZES["a"]}
    assert [offsets[i // 10_000] + i % 10_000 for i in rest] == expected
    assert not set(seen) & set(rest)
    assert len(rest) == 400
    loader.close()
    new.close()


def test_astream_plan_shows_the_rest_of_a_changed_epoch(remotes, tmp_path, capsys) -> None:
    ds = dataset(remotes, tmp_path, {"a": 0.5, "b": 0.5})
    _, state = take(ds, 20)
    ds.close()
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"keras_epoch": 0, "steps": 20, "astream": state}))  # a Keras callback's record
    new = [f"{remotes['a']}=0.8", f"{remotes['b']}=0.2", f"{remotes['c']}=0.1"]
    args = ["plan", "--state", str(path), *(x for s in new for x in ("--stream", s)), "--epoch-size", "700"]
    assert cli([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    expected = dataset(remotes, tmp_path, {"a": 0.8, "b": 0.2, "c": 0.1}, epoch_size=700, on_mixture_change="continue")
    expected.load_state_dict(state)
    assert {k: v for k, v in report.items() if k in expected.mixture_report()} == expected.mixture_report()
    assert report["changes"] == [200]
    assert report["samples"] == 500
    assert [r["stream"] for r in report["streams"]] == [str(remotes[n]) for n in "abc"]
    expected.close()
    assert cli(args) == 0
    text = capsys.readouterr().out
    assert "rest of epoch     500 samples" in text
    assert f"{remotes['c']}" in text
    assert "proportion=0.8" in text
    # The state's own mixture: a plain resume, no change.
    same = ["plan", "--state", str(path), "--stream", f"{remotes['a']}=0.5", "--stream", f"{remotes['b']}=0.5",
            "--epoch-size", "600"]
    assert cli(same) == 0
    assert "none (the state's own mixture)" in capsys.readouterr().out
    assert cli(["plan", "--state", str(path)]) == 2
    assert "--stream" in capsys.readouterr().err
    assert cli([*same, "--batch-size", "8"]) == 2
    assert "--batch-size do(es) not apply with --state" in capsys.readouterr().err


def test_look_alike_streams_keep_what_they_delivered_when_reordered(tmp_path) -> None:
    # Two streams whose shards have the same names, sample counts and bytes: known apart by place.
    twins = {"a": write(tmp_path, "x", 400, 0), "b": write(tmp_path, "y", 400, 10_000)}
    ds = dataset(twins, tmp_path, {"a": 0.5, "b": 0.5})
    seen, state = take(ds, 20)
    ds.close()
    swapped = dataset(twins, tmp_path, {"b": 0.3, "a": 0.7}, on_mixture_change="continue")
    rest, _ = take(swapped, None, state)
    assert not set(seen) & set(rest)
    assert len(seen) + len(rest) == 600
    swapped.close()


def test_a_stream_copied_elsewhere_is_the_same_stream(remotes, tmp_path) -> None:
    import shutil

    moved = dict(remotes)
    moved["a"] = Path(shutil.copytree(remotes["a"], tmp_path / "moved-a"))
    ds = dataset(remotes, tmp_path, {"a": 0.5, "b": 0.5})
    seen, state = take(ds, 20)
    whole, _ = take(ds, None, state)
    ds.close()
    # (a folder caches one remote: the copy gets caches of its own, as the refusal says)
    same = dataset(moved, tmp_path / "elsewhere", {"a": 0.5, "b": 0.5}, on_mixture_change="continue")
    rest, _ = take(same, None, state)
    assert rest == whole  # a plain resume: nothing changed but where a lives
    same.close()
    other = dataset(moved, tmp_path / "elsewhere", {"a": 0.8, "b": 0.2}, on_mixture_change="continue")
    rest, _ = take(other, None, state)
    assert not set(seen) & set(rest)
    other.close()


def test_what_came_before_a_change_travels_to_workers(remotes, tmp_path, monkeypatch) -> None:
    import pickle

    import astream._dataset.mixture as mixture

    ds = dataset(remotes, tmp_path, {"a": 0.5, "b": 0.5})
    _, state = take(ds, 20)
    ds.close()
    new = dataset(remotes, tmp_path, {"a": 0.8, "b": 0.2}, on_mixture_change="continue")
    new.load_state_dict(state)
    want = new.plan(epoch=0, sample_in_epoch=200, workers_per_rank=2, batch_size=BATCH).worker_ids(0, 0, 1)
    seen = new.run.history_of(0, 200)[2]
    clone = pickle.loads(pickle.dumps(new))  # as a loader's worker process receives it
    got_seen = clone.run.history_of(0, 200)[2]
    assert seen.keys() == got_seen.keys()
    for key, masks in seen.items():
        assert all(np.array_equal(masks[k], got_seen[key][k]) for k in masks)

    def replayed(*args):
        raise AssertionError("a worker replayed the earlier segments")

    monkeypatch.setattr(mixture, "seen_before", replayed)
    got = clone.plan(epoch=0, sample_in_epoch=200, workers_per_rank=2, batch_size=BATCH).worker_ids(0, 0, 1)
    assert np.array_equal(got, want)
    clone.close()
    new.close()
