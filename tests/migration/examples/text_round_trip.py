"""Write a dataset with JSONWriter and CSVWriter, then read both back (MosaicML's docs idiom).

The writers take the column names and their encodings, and every sample as a dict. The
written files are what matters: the result holds each file's SHA-1 and size, and the
samples read back with LocalDataset and streamed back by StreamingDataset (shuffled, so the
order is the library's too).
"""

import hashlib
import json
import os
import sys

from streaming import CSVWriter, JSONWriter, LocalDataset, StreamingDataset


def samples():
    for i in range(60):
        yield {"idx": i, "text": f"line {i}: " + "é" * (i % 4), "score": i / 8, "ok": "yes" if i % 3 else "no"}


def files(root):
    out = {}
    for name in sorted(os.listdir(root)):
        with open(os.path.join(root, name), "rb") as f:
            data = f.read()
        out[name] = {"sha1": hashlib.sha1(data).hexdigest(), "bytes": len(data)}
    return out


def main(root, result):
    json_out = os.path.join(root, "json")
    csv_out = os.path.join(root, "csv")
    with JSONWriter(out=json_out, columns={"idx": "int", "text": "str", "score": "float"},
                    hashes=["sha1", "xxh64"], size_limit=1 << 10) as out:
        for sample in samples():
            out.write({k: sample[k] for k in ("idx", "text", "score")})
    with CSVWriter(out=csv_out, columns={"idx": "int", "text": "str", "ok": "str"}, size_limit=1 << 10) as out:
        for sample in samples():
            out.write({k: sample[k] for k in ("idx", "text", "ok")})

    read_back = {}
    for name, path in (("json", json_out), ("csv", csv_out)):
        dataset = LocalDataset(local=path)
        read_back[name] = [dataset[i] for i in range(len(dataset))]
        streamed = StreamingDataset(local=path, shuffle=True, shuffle_seed=7, batch_size=4)
        read_back[f"{name}_streamed"] = list(streamed)
    with open(result, "w") as f:
        json.dump({"json_files": files(json_out), "csv_files": files(csv_out), "read_back": read_back}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
