"""What the agent did, for the host's operator only: codex's event stream read back as a trajectory.

Everything here reads private files of a job root (codex's JSONL events, its session record,
the prompt, the patch, the evaluation's logs) and returns private text. Nothing here writes
a public file or goes through ``runner.public``: the private views (``show``, ``export``,
``report --private``) are its only callers.
"""
