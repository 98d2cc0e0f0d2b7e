"""What the dataset layer lets a user see: figures, timings, metrics, the progress bar.

``stats.py`` (the figures of a loader and its node), ``timings.py`` (``next()`` waits and
stage times), ``metrics.py`` (the exported metric names, one table), ``otel.py`` and
``prometheus.py`` (translations of it), ``progress.py`` (the tqdm bar). Nothing here
imports the ``Loader``: a loader registers itself as a :class:`~astream._dataset.observe.metrics.Source`.
"""
