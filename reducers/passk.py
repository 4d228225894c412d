"""Suite arithmetic over verdicts: pass@k and what counts as an infrastructure failure.

Pure: plain numbers and strings in, numbers and booleans out; imports nothing of
the runner, so the status page, the report and the daemon's ledger agree by
calling the same functions.
"""

from __future__ import annotations

from math import comb

# A failed phase that the agent cannot cause: the host, Docker, git or the runner broke.
INFRA_PHASES = frozenset({"prepare", "precheck", "extract", "baseline"})
# Reasons any phase records when the runner (not the agent) failed in it.
INFRA_REASONS = frozenset(
    {"docker_error", "git_error", "os_error", "internal_error", "interrupted", "missing_input"}
)
# Batch states that end a task without the agent having had its say.
INFRA_STATES = frozenset({"bad_environment", "interrupted"})


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of Chen et al. (2021): 1 - C(n-c, k) / C(n, k).

    ``n`` attempts of one task, ``c`` of them resolved; the probability that at
    least one of ``k`` attempts drawn without replacement resolves.

    Raises:
        ValueError: unless 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def mean_pass_at_k(counts: list[tuple[int, int]], k: int) -> float | None:
    """pass@k of a suite: the mean over the tasks that have at least ``k`` attempts.

    ``counts``: one ``(n, c)`` per task. None when no task has ``k`` attempts.
    """
    values = [pass_at_k(n, c, k) for n, c in counts if n >= k]
    return sum(values) / len(values) if values else None


def is_infra_failure(state: str | None, failure_label: str | None) -> bool:
    """Did this task end without a verdict the agent earned (a broken host or runner)?

    ``failure_label`` is the compact result's ``failed_<phase>_<reason>`` (or a
    verdict label such as ``unresolved_...``, which is never infrastructure).
    """
    if state in INFRA_STATES:
        return True
    if not failure_label or not failure_label.startswith("failed_"):
        return False
    rest = failure_label[len("failed_"):]
    phase, _, reason = rest.partition("_")
    return phase in INFRA_PHASES or reason in INFRA_REASONS
