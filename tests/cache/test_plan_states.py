"""The shuffle's node states kept in the node cache: taken only when they prove themselves."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from astream._cache.plan_states import load_plan_states, save_plan_states
from astream.sampling import EpochPlan


def _plan(**kw: object) -> EpochPlan:
    sizes = np.random.default_rng(3).integers(1, 60, 200)
    return EpochPlan([{"shard_sizes": sizes}], shuffle=True, shuffle_algo="py1e", num_canonical_nodes=8,
                     shuffle_block_size=40, batch_size=4, num_physical_nodes=8, ranks_per_node=2,
                     workers_per_rank=2, epoch=1, **kw)


def test_states_kept_by_one_process_start_another_at_its_own_node(tmp_path: Path) -> None:
    first = _plan()
    first.rank_ids(6, 1)
    save_plan_states(str(tmp_path), first.shuffle_key, first.node_states)
    second = _plan()
    second.node_states.update(load_plan_states(str(tmp_path), second.shuffle_key))
    assert 6 in second.node_states
    assert np.array_equal(second.rank_ids(6, 1), _plan().work()[6, 1])
    assert np.array_equal(second.rank_ids(7, 0), _plan().work()[7, 0])  # states merge as they are found
    save_plan_states(str(tmp_path), second.shuffle_key, second.node_states)
    assert set(load_plan_states(str(tmp_path), first.shuffle_key)) >= {6, 7}


def test_a_file_that_does_not_prove_itself_is_ignored(tmp_path: Path) -> None:
    plan = _plan()
    plan.rank_ids(3, 0)
    save_plan_states(str(tmp_path), plan.shuffle_key, plan.node_states)
    path = tmp_path / ".astream-plan" / f"{plan.shuffle_key}.json"
    assert load_plan_states(str(tmp_path), plan.shuffle_key)
    assert load_plan_states(str(tmp_path), "another-key") == {}
    record = json.loads(path.read_text())
    record["states"]["3"]["state"]["state"] += 1  # a wrong state would be a wrong order
    path.write_text(json.dumps(record))
    assert load_plan_states(str(tmp_path), plan.shuffle_key) == {}
    path.write_text(path.read_text()[:40])
    assert load_plan_states(str(tmp_path), plan.shuffle_key) == {}
    os.chmod(tmp_path, 0o500)  # a folder it cannot write loses only the shortcut
    try:
        save_plan_states(str(tmp_path / "sub"), plan.shuffle_key, plan.node_states)
    finally:
        os.chmod(tmp_path, 0o700)


def test_another_epoch_or_seed_has_another_key() -> None:
    assert _plan().shuffle_key != _plan(shuffle_seed=5).shuffle_key
    assert _plan().shuffle_key == _plan().shuffle_key
