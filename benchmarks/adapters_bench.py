"""Adapter overhead: one epoch through astream's ``Loader`` alone against through each adapter.

The same dataset (``--samples`` uint8 images of 3x32x32 and a label, 16 MB shards, warm),
the same shuffled loader settings; each path takes delivery of every batch in its
framework's form (no compute on it). Each case is a fresh process that reads one epoch to
warm up (imports, first compilations) and times ``--epochs`` more; medians over all:

- ``loader``: ``for batch in loader``;
- ``keras``: ``StreamingPyDataset[i]`` for every ``i``, as ``fit`` reads it with ``workers=1``;
- ``tf.data``: ``as_tf_dataset(loader, x=..., y=...).prefetch(2)``, iterated eagerly;
- ``tf.data-graph``: the same read inside one ``tf.function`` (the graph loop Keras'
  TensorFlow backend runs);
- ``tf.data-stream``: ``as_tf_dataset(..., epochs=None)`` with one iterator across epochs, as
  ``fit(steps_per_epoch=len(loader))`` reads an endless dataset;
- ``jax``: ``device_prefetch(loader)``, waiting for each batch to be on the device.

    KERAS_BACKEND=jax python benchmarks/adapters_bench.py --runs 3
    python benchmarks/adapters_bench.py --paths loader keras --batch-size 128
"""

from __future__ import annotations

import statistics

from _harness import Bench, Metric, data, fmt, parser

PATHS = ("loader", "keras", "tf.data", "tf.data-graph", "tf.data-stream", "jax")
EPOCH = Metric("ms / epoch", lambda r: statistics.median(r["result"]["epoch_s"]) * 1e3, higher=False, spec=".1f")


def main() -> None:
    p = parser(__doc__, "adapters")
    p.add_argument("--paths", nargs="*", default=list(PATHS), choices=PATHS)
    p.add_argument("--samples", type=int, default=16_384)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=5, help="timed epochs per process")
    args = p.parse_args()
    bench = Bench("adapters", args)
    folder = data.mds(bench.data, "images", "images", int(args.samples * args.scale), "16mb")
    for path in args.paths:
        bench.add({"path": path}, "astream", "adapters", "epochs",
                  {"path": path, "local": str(folder), "batch": args.batch_size, "rounds": args.epochs})
    bench.run()
    if "base" in bench.codes:
        bench.report_ab([EPOCH])
        return
    base = bench.median({"path": "loader"}, "astream", EPOCH)
    rows = []
    for config in bench.configs():
        ms = bench.median(config, "astream", EPOCH)
        samples = bench.records[-1]["result"]["samples"]
        over = f"{(ms / base - 1) * 100:+.1f}%" if ms and base and config["path"] != "loader" else ""
        rows.append([config["path"], fmt(ms, ".1f"), fmt(samples / ms * 1e3 if ms else None), over])
    bench.table(f"{args.samples} samples of 3 KB, batch {args.batch_size}, medians of {args.runs} processes x "
                f"{args.epochs} epochs, load {bench.loads()}",
                ["path", "ms / epoch", "samples / s", "overhead vs Loader"], rows)


if __name__ == "__main__":
    main()
