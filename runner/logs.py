"""structlog set-up: JSON lines when not on a terminal, readable lines on one.

Logs go to stderr so stdout carries only the command's report. Events carry
run_id and phase (bound with ``bound_contextvars``), relative paths, hashes and
counts; never a secret, a prompt, a patch or an absolute host path.
"""

from __future__ import annotations

import logging
import sys

import structlog


class _StderrOrNothing:
    """stderr that drops lines once its reader is gone (a batch or worker killed with SIGKILL).

    The task's cleanup after an interrupt logs as it goes; a broken pipe must not stop it
    half-way (no marker, no reduce), so the lines are lost instead.
    """

    def write(self, text: str) -> int:
        try:
            return sys.stderr.write(text)
        except (BrokenPipeError, ValueError):
            return 0

    def flush(self) -> None:
        try:
            sys.stderr.flush()
        except (BrokenPipeError, ValueError):
            pass


def configure_logging(*, json_lines: bool | None = None, level: int = logging.INFO) -> None:
    if json_lines is None:
        json_lines = not sys.stderr.isatty()
    renderer = structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=_StderrOrNothing()),
        cache_logger_on_first_use=False,
    )
