"""pass@k (Chen et al., 2021) and the infrastructure-failure rule, against known values."""

from __future__ import annotations

from math import prod

import pytest

from reducers.passk import infra_label, mean_pass_at_k, pass_at_k


def _chen_numerically_stable(n: int, c: int, k: int) -> float:
    """The paper's own formulation: 1 - prod(1 - k / i for i in n-c+1..n)."""
    if n - c < k:
        return 1.0
    return 1.0 - prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 0, 1, 0.0),
        (5, 5, 1, 1.0),
        (10, 3, 1, 0.3),  # pass@1 is the mean over attempts
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (2, 1, 2, 1.0),  # fewer failures than draws: some draw resolves
        (200, 13, 100, 1 - 0.0),  # n-c=187 >= 100: computed, close to 1
    ],
)
def test_pass_at_k_known_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(_chen_numerically_stable(n, c, k), abs=1e-12)
    if (n, c, k) != (200, 13, 100):
        assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_1_equals_the_resolved_fraction_for_every_n_and_c() -> None:
    for n in range(1, 12):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n)


def test_pass_at_k_grows_with_k() -> None:
    values = [pass_at_k(10, 2, k) for k in range(1, 11)]
    assert values == sorted(values) and values[-1] == 1.0 and values[0] == pytest.approx(0.2)


@pytest.mark.parametrize(("n", "c", "k"), [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4), (0, 0, 1)])
def test_pass_at_k_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_mean_pass_at_k_skips_tasks_with_fewer_attempts() -> None:
    counts = [(4, 1), (4, 4), (1, 1)]
    assert mean_pass_at_k(counts, 1) == pytest.approx((0.25 + 1.0 + 1.0) / 3)
    assert mean_pass_at_k(counts, 2) == pytest.approx((0.5 + 1.0) / 2)
    assert mean_pass_at_k(counts, 5) is None


@pytest.mark.parametrize(
    ("label", "infra"),
    [
        ("failed_extract_docker_error", True),
        ("failed_extract_unsafe_archive_entry", True),  # the image's tree, not the agent
        ("failed_precheck_codex_not_found", True),
        ("failed_codex_os_error", True),
        ("failed_evaluate_internal_error", True),
        ("failed_patch_missing_input", True),
        ("failed_codex_codex_model_error", True),  # the provider's, as the compact run's infra_failure says
        ("failed_codex_codex_timeout", False),
        ("failed_patch_empty_patch", False),
        ("failed_codex_codex_wrote_runner_files", False),
        ("unresolved_eval_timeout", False),
        ("resolved_single_tag_eval", False),
        (None, False),
    ],
)
def test_infra_failures_are_the_host_and_the_runner_never_the_agent(label: str | None, infra: bool) -> None:
    assert infra_label(label) is infra
