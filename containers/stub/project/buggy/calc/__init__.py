"""calc: a tiny arithmetic package (the stub task's project under test)."""

__version__ = "0.1.0"
