"""Sample order, pure NumPy (layer 6 of DESIGN.md; public facade: ``astream.sampling``).

- ``shuffle/``: the shuffle algorithms (``get_shuffle``), one module per family, plus the
  span bookkeeping and the canonical-node-wise driver they share;
- ``partition``: ``orig`` and ``relaxed`` partitions over nodes, ranks, workers, batches;
- ``streams``: stream weights (proportion / repeat / choose, epoch size) and the per-epoch
  resampling of shards;
- ``batching``: the ``per_stream``, ``stratified`` and ``device_per_stream`` merges;
- ``plan``: ``EpochPlan``, which puts the above together as MosaicML's ``generate_work``
  does (``merged``: its tensor for the merging batching methods; ``work``: ``plan_epoch``,
  the same as one function);
- ``remix`` and ``remainder``: the plan of the rest of an epoch whose mixture changed (the
  mixtures' history in, the current segment's plan out) and its per-stream counts;
- ``defaults``, ``validation``, ``warnings``: resolved defaults, parameter checks raising
  ``ConfigError``, and ``SamplingWarning``.

Everything here is bit-exact with MosaicML Streaming 0.13 (py1b with 0.9.1), quirks included;
docs/sample-order.md describes the algorithms.
"""
