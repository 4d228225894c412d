"""What a suite may leave on its host's disks: the finished tasks' trees (``--keep-trees``) and the
images the runner pulled (``--image-budget-gb``). One policy for the batch and the worker.

Invariants:
- only a *scored* task's bulk goes (state ``done``): a failed or cancelled task keeps its tree,
  because its rerun or the fleet's retry resumes from it; what goes is ``buggy-source/`` and the
  runner's baseline git dir, never the patch, logs, markers or public files (``--reduce`` and the
  report need only those);
- images go only through ``runner.images.PulledImages.evict``: the runner's own pulls, least
  recently used first, never one a task here still needs; a prefetch waits for room
  (``room_to_prefetch``) rather than pull past the budget.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import structlog

from reducers.outcome import TaskFacts, TaskState
from runner.errors import BadInputError
from runner.images import PulledImages, gigabytes
from runner.jobroot import JobRoot
from runner.trees import remove_tree

log = structlog.get_logger(__name__)

MAX_IMAGE_BUDGET_GB = 100_000


def check_image_budget(gigabytes: float) -> float:
    if not 0 < gigabytes <= MAX_IMAGE_BUDGET_GB:
        raise BadInputError("--image-budget-gb must be a positive number of gigabytes")
    return gigabytes


class KeepTrees(StrEnum):
    ALL = "all"  # today's behaviour: every tree stays
    FAILED = "failed"  # an unresolved attempt's tree stays (to look at); a resolved one's goes
    NONE = "none"  # every scored attempt's tree goes


@dataclass(frozen=True)
class DiskPolicy:
    keep_trees: KeepTrees = KeepTrees.ALL
    image_budget_gb: float | None = None  # None: images are never removed

    def __post_init__(self) -> None:
        if self.image_budget_gb is not None:
            check_image_budget(self.image_budget_gb)

    def tree_goes(self, facts: TaskFacts) -> bool:
        if facts.state is not TaskState.DONE or self.keep_trees is KeepTrees.ALL:
            return False
        return self.keep_trees is KeepTrees.NONE or bool(facts.resolved)

    def after_task(self, job: JobRoot, facts: TaskFacts) -> bool:
        """Remove the finished task's tree when the policy says so; True when it went."""
        if not self.tree_goes(facts):
            return False
        try:
            remove_tree(job.buggy_source)
            remove_tree(job.baseline_git_dir)
        except OSError as e:  # the task's result stands; only the disk is not freed
            log.warning("tree_not_removed", tag=job.tag, error_type=type(e).__name__)
            return False
        log.info("tree_removed", tag=job.tag, policy=self.keep_trees.value)
        return True

    def room_to_prefetch(self, client, state_dir: Path, needed: Iterable[str]) -> bool:  # client: docker.DockerClient
        """May a prefetch pull one more image? Always without a budget; with one, only when, after
        evicting what ``needed`` does not hold, the pulled images and one more fit in it."""
        if self.image_budget_gb is None:
            return True
        return PulledImages(state_dir).room_for_one(client, gigabytes(self.image_budget_gb), keep=needed)

    def evict(self, client, state_dir: Path, needed: Iterable[str]) -> int:  # client: docker.DockerClient
        """Evict pulled images over the budget, keeping ``needed`` (refs the host's tasks still need)."""
        if self.image_budget_gb is None:
            return 0
        return len(PulledImages(state_dir).evict(client, gigabytes(self.image_budget_gb), keep=needed))
