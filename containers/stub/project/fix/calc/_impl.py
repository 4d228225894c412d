"""Implementation helpers for calc.mathops."""


def add_impl(a, b):
    """Return the sum of a and b."""
    return a + b
