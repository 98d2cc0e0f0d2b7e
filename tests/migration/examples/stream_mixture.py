"""Mix several streams in one epoch with proportion, and with repeat and choose (MosaicML's docs).

Three small datasets are written; one StreamingDataset mixes them by proportion over a
given epoch size, another up-samples one with repeat and takes a fixed number of samples
from another with choose. The result holds the epochs' samples in order (which stream,
which sample) for two epochs of each.
"""

import json
import os
import sys

from streaming import MDSWriter, Stream, StreamingDataset


def write(root, name, count):
    with MDSWriter(out=os.path.join(root, name), columns={"source": "str", "n": "int"}, size_limit=512) as out:
        for n in range(count):
            out.write({"source": name, "n": n})


def epochs(dataset, count):
    return [[(s["source"], s["n"]) for s in dataset] for _ in range(count)]


def main(root, result):
    for name, count in (("books", 120), ("web", 300), ("code", 45)):
        write(root, name, count)

    streams = [
        Stream(remote=os.path.join(root, "books"), local=os.path.join(root, "cache", "books"), proportion=0.5),
        Stream(remote=os.path.join(root, "web"), local=os.path.join(root, "cache", "web"), proportion=0.3),
        Stream(remote=os.path.join(root, "code"), local=os.path.join(root, "cache", "code"), proportion=0.2),
    ]
    mixed = StreamingDataset(streams=streams, epoch_size=400, shuffle=True, shuffle_seed=7, batch_size=8)

    weighted = [
        Stream(remote=os.path.join(root, "books"), local=os.path.join(root, "cache2", "books"), repeat=2.5),
        Stream(remote=os.path.join(root, "web"), local=os.path.join(root, "cache2", "web"), choose=50),
        Stream(remote=os.path.join(root, "code"), local=os.path.join(root, "cache2", "code")),
    ]
    repeated = StreamingDataset(streams=weighted, shuffle=True, shuffle_seed=11, shuffle_algo="py1s", batch_size=4)
    with open(result, "w") as f:
        json.dump({"proportion": {"len": len(mixed), "epochs": epochs(mixed, 2)},
                   "repeat_choose": {"len": len(repeated), "epochs": epochs(repeated, 2)}}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
