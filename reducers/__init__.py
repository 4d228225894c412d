"""Reducers: markers in, compact public JSON out, through one safety guard.

Pure: nothing here imports docker or git, starts a process or reads a log's
content. The runner's ``reduce`` phase and ``--reduce`` both call ``reduce_job``.
"""
