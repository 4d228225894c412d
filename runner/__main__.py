import sys

# Subcommands with their own parsers; everything else is the flag modes of runner.cli.
SUBCOMMANDS = {
    "worker": ("runner.fleet.worker", "main"),
    "submit": ("runner.fleet.commands", "submit_main"),
    "status": ("runner.fleet.commands", "status_main"),
    "cancel": ("runner.fleet.commands", "cancel_main"),
}

if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
    import importlib

    module, function = SUBCOMMANDS[sys.argv[1]]
    sys.exit(getattr(importlib.import_module(module), function)(sys.argv[2:]))

from runner.cli import main  # noqa: E402

sys.exit(main())
