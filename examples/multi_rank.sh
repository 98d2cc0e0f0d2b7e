#!/usr/bin/env bash
# Four local ranks reading one shuffled dataset, launched torchrun-style without torch.
#
#   bash examples/multi_rank.sh            # writes a tiny dataset in a temp folder
#   bash examples/multi_rank.sh DIR        # an MDS dataset with an int64 "id" column
#
# Each rank learns its place from RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE (what
# torchrun sets), the ranks of the node share one cache and one node agent (the first to
# arrive starts it), and each reads its own part of the epoch. The script then checks that
# the parts are disjoint and cover the dataset.
set -euo pipefail

PYTHON="${PYTHON:-python3}"
WORLD=4
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
data="${1:-$work/ds}"

if [ $# -eq 0 ]; then
  "$PYTHON" - "$data" <<'PY'
import sys
import numpy as np
import astream
with astream.MDSWriter(out=sys.argv[1], columns={"id": "int64", "x": "ndarray:float32:4"}, size_limit="2kb") as w:
    for i in range(1000):
        w.write({"id": i, "x": np.full(4, i, np.float32)})
PY
fi

# One job id for the ranks to meet under (torchrun sets TORCHELASTIC_RUN_ID; any launcher works).
export ASTREAM_RUN_ID="multi-rank-$$"
for rank in $(seq 0 $((WORLD - 1))); do
  RANK=$rank WORLD_SIZE=$WORLD LOCAL_RANK=$rank LOCAL_WORLD_SIZE=$WORLD \
    "$PYTHON" - "$data" "$work/cache" "$work/rank$rank.json" <<'PY' &
import json, os, sys
import astream

data, cache, out = sys.argv[1:]
ds = astream.StreamingDataset(remote=data, local=cache, shuffle=True, shuffle_seed=42, batch_size=16)
loader = astream.Loader(ds)
ids = [int(i) for batch in loader for i in batch["id"]]
state = loader.state_dict()
ds.close()
with open(out, "w") as f:
    json.dump({"rank": int(os.environ["RANK"]), "ids": ids, "size": ds.size, "state": state}, f)
print(f"rank {os.environ['RANK']}: {len(ids)} samples, first {ids[:4]}, state {state['sample_in_epoch']}")
PY
done
wait

"$PYTHON" - "$work" "$WORLD" <<'PY'
import json, sys
from pathlib import Path
work, world = Path(sys.argv[1]), int(sys.argv[2])
ranks = [json.loads((work / f"rank{r}.json").read_text()) for r in range(world)]
seen = [i for r in ranks for i in r["ids"]]
assert len(set(seen)) == len(seen), "two ranks read the same sample"
assert len(seen) == ranks[0]["size"], f"the ranks read {len(seen)} of {ranks[0]['size']} samples"
print(f"{world} ranks read all {len(seen)} samples, none twice")
PY
