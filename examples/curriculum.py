"""A curriculum: the data mixture changes at given steps, and each change resumes mid-epoch.

A plain training loop over three sources. At step 0 the mixture is mostly "web"; at step
CHANGES[0] the job is restarted with more "code"; at CHANGES[1] a "math" source is added
(an annealing phase). Each restart is what a real job does: build the dataset with the new
weights and ``on_mixture_change="continue"``, load the last checkpoint's state, and go on.
Within the epoch no sample is delivered twice; the next epoch is a plain epoch of the last
mixture.

    python examples/curriculum.py            # writes three tiny datasets to a temp folder
"""

from __future__ import annotations

import collections
import json
import tempfile
from pathlib import Path

import numpy as np

from astream import Loader, MDSWriter, Stream, StreamingDataset

SOURCES = {"web": 3000, "code": 1500, "math": 800}
# (step at which it takes over, weights)
CURRICULUM = [(0, {"web": 0.9, "code": 0.1}), (40, {"web": 0.5, "code": 0.5}),
              (80, {"web": 0.4, "code": 0.3, "math": 0.3})]
BATCH, EPOCH_SIZE = 16, 2400


def write_sources(root: Path) -> None:
    for k, (name, n) in enumerate(SOURCES.items()):
        with MDSWriter(out=str(root / name), columns={"id": "int64", "x": "ndarray:float32:8"}) as w:
            for i in range(n):
                w.write({"id": k * 100_000 + i, "x": np.full(8, i, np.float32)})


def dataset(root: Path, weights: dict[str, float]) -> StreamingDataset:
    streams = [Stream(local=str(root / name), proportion=p) for name, p in weights.items()]
    return StreamingDataset(streams=streams, epoch_size=EPOCH_SIZE, shuffle=True, batch_size=BATCH,
                            on_mixture_change="continue")


def train_step(batch: dict[str, np.ndarray]) -> None:
    _ = batch["x"].mean()  # the model would learn here


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_sources(root)
        checkpoint = root / "checkpoint.json"
        seen: list[int] = []
        step = 0
        report: dict[str, object] = {}
        for phase, (start, weights) in enumerate(CURRICULUM):
            end = CURRICULUM[phase + 1][0] if phase + 1 < len(CURRICULUM) else None
            ds = dataset(root, weights)
            loader = Loader(ds, batch_size=BATCH)
            if checkpoint.exists():  # a restart: the rest of the epoch under the new weights
                loader.load_state_dict(json.loads(checkpoint.read_text()))
            mix: collections.Counter[str] = collections.Counter()
            for batch in loader:
                train_step(batch)
                ids = batch["id"].tolist()
                seen += ids
                mix.update(list(SOURCES)[i // 100_000] for i in ids)
                step += 1
                if step % 10 == 0:  # checkpoint (the model's weights would go beside it)
                    checkpoint.write_text(json.dumps(loader.state_dict()))
                if step == end:
                    break
            share = ", ".join(f"{k} {v / sum(mix.values()):.2f}" for k, v in sorted(mix.items()))
            print(f"phase {phase} (steps {start}-{step}): {share}")
            if end is None:
                report = ds.stats().mixture  # what the last change did to the rest of the epoch
            ds.close()
        rows = report["streams"]
        assert isinstance(rows, list)
        print(f"changes at samples {report['changes']}; the rest of the epoch: "
              + ", ".join(f"{Path(r['stream']).name} {r['given']}" for r in rows))
        counts = collections.Counter(seen)
        print(f"epoch 0: {len(seen)} samples, {len(counts)} distinct: no sample repeated"
              if len(counts) == len(seen) else f"epoch 0: {len(seen) - len(counts)} samples repeated")


if __name__ == "__main__":
    main()
