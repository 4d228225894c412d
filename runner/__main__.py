import importlib
import sys

from runner import early_signals

early_signals.install()  # before the heavy imports below: a signal then is not lost

# `python -m runner NAME ...` runs that module's function(argv); anything else is the flag modes
# of the single-task CLI.
SUBCOMMANDS = {
    "report": ("runner.views.report", "main"),
    "worker": ("runner.fleet.worker", "main"),
    "submit": ("runner.fleet.commands", "submit_main"),
    "status": ("runner.fleet.commands", "status_main"),
    "cancel": ("runner.fleet.commands", "cancel_main"),
    "task": ("runner.task_process", "main"),  # a supervisor's child (runner.supervisor), not for operators
}


def _main(argv: list[str]) -> int:
    if argv and argv[0] in SUBCOMMANDS:
        module, function = SUBCOMMANDS[argv[0]]
        return getattr(importlib.import_module(module), function)(argv[1:])
    from runner.cli import main

    return main(argv)


sys.exit(_main(sys.argv[1:]))
