"""Suite arithmetic over verdicts: pass@k and what counts as an infrastructure failure.

Pure: plain numbers and strings in, numbers and booleans out; imports nothing of
the runner, so the status page, the report and the daemon's ledger agree by
calling the same functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from math import comb
from typing import Any, TypeVar

from reducers.models import Reason

K = TypeVar("K", str, tuple[str, str])

# The k values a summary shows at most (pass@1 always, then these up to the attempts scored).
K_VALUES = (1, 2, 3, 5, 10, 20, 50, 100)
# A failed phase that the agent cannot cause: the host, Docker, git or the runner broke.
INFRA_PHASES = frozenset({"prepare", "precheck", "extract", "baseline"})
# Reasons any phase records when the runner, the host or the model provider (not the agent)
# failed in it. A model error is the provider's: the compact run marks it ``infra_failure``.
INFRA_REASONS = frozenset(
    {Reason.DOCKER_ERROR, Reason.GIT_ERROR, Reason.OS_ERROR, Reason.INTERNAL_ERROR, Reason.INTERRUPTED,
     Reason.MISSING_INPUT, Reason.CODEX_MODEL_ERROR, Reason.EXTRACT_TIMEOUT, Reason.BASELINE_TIMEOUT}
)


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


def infra_label(failure_label: str | None) -> bool:
    """Does this failure label name a failure the agent could not cause (a broken host or runner)?

    ``failure_label`` is the compact result's ``failed_<phase>_<reason>`` (or a
    verdict label such as ``unresolved_...``, which is never infrastructure). The one
    rule: ``reducers.outcome.task_facts`` applies it for every ledger and view.
    """
    if not failure_label or not failure_label.startswith("failed_"):
        return False
    rest = failure_label[len("failed_"):]
    phase, _, reason = rest.partition("_")
    return phase in INFRA_PHASES or reason in INFRA_REASONS


def pass_at_table(n: int, c: int) -> dict[int, float]:
    """pass@k of one task for every k in ``K_VALUES`` that ``n`` scored attempts allow."""
    return {k: pass_at_k(n, c, k) for k in K_VALUES if k <= n}


def suite_pass_at(counts: list[tuple[int, int]]) -> dict[int, float]:
    """Mean pass@k over the tasks, for every k some task has attempts enough for."""
    return {k: value for k in K_VALUES if (value := mean_pass_at_k(counts, k)) is not None}


def attempt_counts(outcomes: Iterable[tuple[K, bool, bool]]) -> dict[K, tuple[int, int, int]]:
    """Per key (a tag, or a suite and tag), sorted: (attempts, n scored, c resolved).

    ``outcomes``: one (key, scored, resolved) per attempt; an unscored attempt (the host
    broke it, or it has not finished) counts among the attempts only.
    """
    counts: dict[K, list[int]] = {}
    for key, was_scored, resolved in outcomes:
        total = counts.setdefault(key, [0, 0, 0])
        total[0] += 1
        total[1] += was_scored
        total[2] += was_scored and resolved
    return {key: (total[0], total[1], total[2]) for key, total in sorted(counts.items())}


def tag_pass_at(outcomes: list[tuple[str, bool, bool]]) -> list[dict[str, Any]]:
    """Per tag (sorted): attempts, n scored, c resolved, pass@k for every k that n allows."""
    return [
        {"tag": tag, "attempts": attempts, "scored": n, "resolved": c,
         "pass_at": {str(k): round(v, 6) for k, v in pass_at_table(n, c).items()}}
        for tag, (attempts, n, c) in attempt_counts(outcomes).items()
    ]


def suite_pass_at_summary(tags: list[dict[str, Any]]) -> dict[str, Any]:
    """The suite's mean pass@k over the per-tag summaries of ``tag_pass_at``."""
    counts = [(item["scored"], item["resolved"]) for item in tags]
    return {
        "tags": len(tags),
        "attempts": sum(item["attempts"] for item in tags),
        "mean_pass_at": {str(k): round(v, 6) for k, v in suite_pass_at(counts).items()},
    }


def pass_at_markdown(tags: list[dict[str, Any]], suite: dict[str, Any]) -> list[str]:
    """The per-tag pass@k table and the suite's line, as Markdown lines."""
    ks = sorted({int(k) for item in tags for k in item["pass_at"]})
    lines = ["## Per tag", "", "| tag | attempts | scored (n) | resolved (c) | "
             + " | ".join(f"pass@{k}" for k in ks) + " |", "|---|---|---|---|" + "---|" * len(ks)]
    for item in tags:
        cells = [f"{item['pass_at'][str(k)]:.3f}" if str(k) in item["pass_at"] else "-" for k in ks]
        lines.append(f"| {item['tag']} | {item['attempts']} | {item['scored']} | {item['resolved']} | "
                     + " | ".join(cells) + " |")
    means = ", ".join(f"mean pass@{k} {v:.3f}" for k, v in suite["mean_pass_at"].items()) or "nothing scored yet"
    return [*lines, "", f"Suite: {means} over {suite['tags']} tags, {suite['attempts']} attempts"]
