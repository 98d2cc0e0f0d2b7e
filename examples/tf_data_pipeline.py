"""A tf.data pipeline over astream: typed element spec, a string column, map, prefetch, fit.

    python examples/tf_data_pipeline.py              # writes a tiny dataset in a temp folder
    python examples/tf_data_pipeline.py --data DIR   # an MDS dataset with text (str) and label (int64)

The element spec comes from the dataset's MDS columns; astream's loader does the
reading, shuffling and batching (in MosaicML Streaming's order), tf.data the rest.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # the model below trains in TF
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import astream
from astream.adapters.tf import as_tf_dataset

WORDS = ["red", "green", "blue", "cyan", "magenta", "yellow", "black", "white"]


def write_dataset(path: Path, samples: int = 1024) -> None:
    """Short texts; the label is whether "red" occurs in them."""
    rng = np.random.default_rng(0)
    with astream.MDSWriter(out=str(path), columns={"text": "str", "label": "int64"}, size_limit="8kb") as w:
        for _ in range(samples):
            words = rng.choice(WORDS, size=int(rng.integers(2, 6)))
            w.write({"text": " ".join(words), "label": int("red" in words)})


def main() -> None:
    import keras

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="an MDS dataset (default: write a tiny one)")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if data is None:
            data = Path(tmp) / "ds"
            write_dataset(data)
        ds = astream.StreamingDataset(remote=str(data), local=str(Path(tmp) / "cache"), shuffle=True, batch_size=32)
        loader = astream.Loader(ds, drop_last=True)
        pipeline = as_tf_dataset(loader, x="text", y="label")
        print("element_spec:", pipeline.element_spec)

        vocab = tf.constant(WORDS)

        def featurize(text: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            # Bag of words in the graph: split the strings, count each vocabulary word.
            tokens = tf.strings.split(text)
            counts = tf.reduce_sum(tf.cast(tf.equal(tokens[..., None], vocab), tf.float32), axis=1)
            return counts.to_tensor() if isinstance(counts, tf.RaggedTensor) else counts, label

        train = pipeline.map(featurize, num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)
        model = keras.Sequential([keras.Input((len(WORDS),)), keras.layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer=keras.optimizers.Adam(0.1), loss="binary_crossentropy", metrics=["accuracy"])
        history = model.fit(train, epochs=args.epochs, verbose=2, shuffle=False)  # astream shuffled
        ds.close()
    accuracy = history.history["accuracy"][-1]
    print(f"accuracy after {args.epochs} epochs: {accuracy:.3f}")
    if accuracy < 0.9:
        raise SystemExit("the model did not learn")


if __name__ == "__main__":
    main()
