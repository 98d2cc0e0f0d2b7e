"""One of two ``jax.distributed`` processes: each loads its rank's batch, together one global array.

``python jax_dist_job.py PROCESS_ID PORT DATA CACHE`` with RANK/WORLD_SIZE/LOCAL_RANK/
LOCAL_WORLD_SIZE set for astream; prints one JSON line.
"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
from adapterkit import make_loader
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from astream.adapters.jax import device_prefetch


def main() -> None:
    process, port, data, cache = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process,
                               local_device_ids=None)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    loader = make_loader(data, cache, drop_last=True)
    local = [ids.tolist() for ids in loader.batch_ids(0)]  # this rank's batches of the epoch it reads
    out = {"process": process, "devices": len(jax.devices()), "local_devices": len(jax.local_devices()),
           "local": local, "global_shapes": [], "shards": []}
    for batch in device_prefetch(loader, sharding=sharding):
        ids = batch["id"]
        out["global_shapes"].append(list(ids.shape))
        out["shards"].append([[int(d.id), s.index[0].start, np.asarray(s.data).tolist()]
                              for s in ids.addressable_shards for d in [s.device]])
    loader.dataset.close()
    print(json.dumps(out))
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
