"""Views of a suite: the health, metrics and status endpoints, and the offline report.

They read a ``StatusSource`` (``runner.views.model``) and never the worker's internals,
so the worker, the local batch and the tests feed them the same way.
"""
