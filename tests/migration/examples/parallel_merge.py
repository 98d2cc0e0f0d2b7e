"""Convert groups of raw data in parallel, one MDSWriter per sub-directory, then merge_index.

MosaicML's docs convert a large dataset with a multiprocessing Pool: each task writes its
group into a sub-directory of the output root, and merge_index joins the sub-directories'
index.json files into one dataset that StreamingDataset reads as a whole.
"""

import json
import os
import sys
from multiprocessing import Pool

from streaming import MDSWriter, StreamingDataset
from streaming.base.util import merge_index

columns = {"number": "int", "square": "str"}


def get_data(start, end):
    for number in range(start, end):
        yield {"number": number, "square": str(number * number)}


def convert_to_mds(args):
    sub_out_root, start, end = args
    with MDSWriter(out=sub_out_root, columns=columns, size_limit=256) as out:
        for sample in get_data(start, end):
            out.write(sample)
    return sub_out_root


def main(root, result):
    out_root = os.path.join(root, "data")
    groups = [(os.path.join(out_root, str(group)), group * 25, group * 25 + 25) for group in range(4)]
    with Pool(processes=2) as pool:
        written = list(pool.imap(convert_to_mds, groups))

    merge_index(out_root, keep_local=True)

    with open(os.path.join(out_root, "index.json"), "rb") as f:
        index = f.read()
    dataset = StreamingDataset(local=out_root, remote=None, shuffle=False, batch_size=10)
    numbers = [(sample["number"], sample["square"]) for sample in dataset]
    with open(result, "w") as f:
        json.dump({"written": [os.path.relpath(p, root) for p in written], "index": json.loads(index),
                   "numbers": numbers}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
