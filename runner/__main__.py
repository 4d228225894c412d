import sys

from runner.containment import signals

signals.install()  # before the heavy imports below: a signal then is not lost


def _main(argv: list[str]) -> int:
    # `python -m runner COMMAND ...` runs that command (runner.entry.COMMANDS, the one table),
    # importing only what it needs; anything else is the flag modes of the single-task CLI.
    from runner.entry import COMMANDS, run_command

    if argv and argv[0] in COMMANDS:
        return run_command(argv[0], argv[1:])
    from runner.cli import main

    return main(argv)


sys.exit(_main(sys.argv[1:]))
