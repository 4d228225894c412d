import sys

from runner import early_signals

early_signals.install()  # before the heavy imports below: a signal then is not lost

from runner.cli import main  # noqa: E402

sys.exit(main())
