"""The fleet: a queue (Dramatiq on Redis), a worker per trusted host, the suite ledger.

Beside the pipeline, not inside it: a worker runs each task as the same isolated
single-task process as ``--execute`` and the local batch.
"""
