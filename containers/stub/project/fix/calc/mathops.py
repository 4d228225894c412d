"""Basic arithmetic operations."""

from calc._impl import add_impl


def add(a, b):
    """Return the sum of a and b."""
    return add_impl(a, b)
