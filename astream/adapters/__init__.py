"""Framework adapters: each imports its framework only when it is used.

- :mod:`astream.adapters.keras`: ``StreamingPyDataset`` (a ``keras.utils.PyDataset``)
  and ``StreamingCheckpoint`` (a callback that makes ``model.fit`` resumable mid-epoch).
- :mod:`astream.adapters.tf`: ``as_tf_dataset`` (a ``tf.data.Dataset`` over a Loader).
- :mod:`astream.adapters.jax`: ``device_prefetch`` (batches already on the device).
- :mod:`astream.adapters.torch`: ``StreamingIterableDataset`` (for gradual migration).

Importing one of them without its framework raises :class:`astream.errors.MissingExtraError`
naming the pip extra; none of them imports its framework before it is needed, so
``KERAS_BACKEND`` may still be set after ``import astream.adapters.keras``.
"""
