"""Loader workers: what they run, how they start, and how their batches are merged.

``job.py`` (what a worker runs, and the messages it emits), ``pool.py`` (the pool that
merges workers' batches by the plan's schedule), ``spawn.py`` (worker processes and their
pipes), ``handoff.py`` (the consumer's stand-ins while processes start), ``crew.py``
(processes kept between epochs), ``startup.py`` (how processes start), ``autoworkers.py``
and ``autowatch.py`` (the count of ``num_workers="auto"``).
"""
