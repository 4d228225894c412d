"""Reproduce script of the stub task `calc_add` (the oracle; it lives outside the source tree).

Usage: python3 reproduce.py VERSION SOURCE_DIR
  VERSION     buggy | fixed | patched (only echoed; the checks are the same)
  SOURCE_DIR  the project tree to test, e.g. /app/source_code_buggy

Prints a line with "FIX CONFIRMED" and exits 0 only when calc.mathops.add adds; otherwise
prints a line starting with "FAILED:" and exits 1 (also when the import itself fails, for
example when a patch imports calc._impl but did not add it). Exit 2 means bad usage.
Never writes bytecode into SOURCE_DIR.
"""

import os
import sys

sys.dont_write_bytecode = True

CASES = [((2, 3), 5), ((-1, 1), 0)]


def fail(message):
    print("FAILED: " + message)
    return 1


def main(argv):
    if len(argv) != 3:
        print("usage: reproduce.py VERSION SOURCE_DIR")
        return 2
    version, source_dir = argv[1], os.path.realpath(argv[2])
    print(f"Checking calc.mathops.add ({version} version) in {source_dir}")
    if not os.path.isdir(source_dir):
        return fail(f"source directory {source_dir} does not exist")
    sys.path.insert(0, source_dir)
    try:
        from calc import mathops
    except Exception as exc:  # any import-time error is a failed fix, never a crash
        return fail(f"cannot import calc.mathops: {type(exc).__name__}: {exc}")
    module_file = os.path.realpath(getattr(mathops, "__file__", "") or "")
    if not module_file.startswith(source_dir + os.sep):
        return fail(f"calc.mathops was imported from outside {source_dir}: {module_file}")
    for args, expected in CASES:
        call = f"add({args[0]}, {args[1]})"
        try:
            got = mathops.add(*args)
        except Exception as exc:
            return fail(f"{call} raised {type(exc).__name__}: {exc}")
        if got != expected:
            return fail(f"{call} returned {got!r}, expected {expected!r}")
        print(f"ok: {call} == {expected!r}")
    print("FIX CONFIRMED: calc.mathops.add returns the sum")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
