"""A StreamingDataset subclass whose __getitem__ decodes each raw sample (MosaicML's idiom).

Written as MosaicML Streaming's docs teach it: convert samples with MDSWriter, subclass
StreamingDataset, call super().__getitem__ and turn the raw columns into what the model
wants. Only the import line differs between the two libraries.
"""

import json
import os
import sys

import numpy as np
from streaming import MDSWriter, StreamingDataset


class CustomDataset(StreamingDataset):
    def __init__(self, local, remote, batch_size):
        super().__init__(local=local, remote=remote, shuffle=True, shuffle_seed=42, batch_size=batch_size)

    def __getitem__(self, idx):
        obj = super().__getitem__(idx)
        # The model wants scaled pixels, a shifted label and a normalised caption.
        pixels = obj["x"].astype(np.float32) / 255
        return {"x": round(float(pixels.sum()), 6), "y": int(obj["y"]) + 100, "caption": obj["caption"].upper()}


def main(root, result):
    remote = os.path.join(root, "remote")
    local = os.path.join(root, "cache")
    columns = {"x": "ndarray:uint8:4", "y": "int", "caption": "str"}
    with MDSWriter(out=remote, columns=columns, compression="zstd", size_limit=1 << 10) as out:
        for i in range(150):
            out.write({"x": (np.arange(4) * 7 + i).astype(np.uint8), "y": i % 9, "caption": f"sample {i}"})

    dataset = CustomDataset(local=local, remote=remote, batch_size=8)
    picked = [dataset[i] for i in (0, 42, 149)]
    epoch = list(dataset)
    with open(result, "w") as f:
        json.dump({"len": len(dataset), "picked": picked, "epoch": epoch}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
