import importlib
import sys

from runner import early_signals

early_signals.install()  # before the heavy imports below: a signal then is not lost

# `python -m runner NAME ...` runs that module's main(argv); anything else is the single-task CLI.
SUBCOMMANDS = {
    "report": "runner.views.report",
}


def _main(argv: list[str]) -> int:
    if argv and argv[0] in SUBCOMMANDS:
        return importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:])
    from runner.cli import main

    return main(argv)


sys.exit(_main(sys.argv[1:]))
