"""The job-root layout, in one place.

Invariant: every path the runner writes is derived here, so the layout in the
README, the plan mode and the code cannot drift apart. Public output names
paths only relative to the job root.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from reducers.compact import BenchmarkRun

PROMPT = "context/prompt.md"
BUGGY_SOURCE = "buggy-source"
# The runner's own git directory for the baseline, outside the agent's tree, so nothing the
# agent writes (a .git/config with hooks or an fsmonitor, say) runs in the runner's git.
BASELINE_GIT_DIR = ".baseline.git"
MARKERS = "result-markers"
LOGS = "logs"
LAST_MESSAGE = "codex-last-message.txt"
BENCHMARK_RUN = "benchmark_run.compact.json"
BENCHMARK_RESULT = "benchmark_result.compact.json"
REAL_RESULT = "real-result.public.json"
PUBLIC_FILES = (BENCHMARK_RUN, BENCHMARK_RESULT, REAL_RESULT)
# Text the reference's synthetic staging writes; a prompt still holding it was never replaced.
SYNTHETIC_PROMPT_MARKER = "Prompt Placeholder"
JOB_ID_FILE = ".runner-job-id"
# codex's HOME: a private scratch directory, outside buggy-source/, remade for every codex run,
# so that the operator's dotfiles neither run nor change.
AGENT_HOME = "agent-home"


def patch_relpath(tag: str) -> str:
    return f"Patches/{tag}/attempt.patch"


@dataclass(frozen=True)
class JobRoot:
    """One task's private directory and the names of everything in it (the layout, in one place).

    Paths only: building one touches nothing, so a driver, a phase and the reducers agree on
    where the prompt, the tree, the markers, the logs and the public files are.
    """

    root: Path
    tag: str

    @classmethod
    def at(cls, root: Path, tag: str) -> JobRoot:
        return cls(root=root.expanduser().resolve(), tag=tag)

    @property
    def prompt(self) -> Path:
        return self.root / PROMPT

    @property
    def buggy_source(self) -> Path:
        return self.root / BUGGY_SOURCE

    @property
    def baseline_git_dir(self) -> Path:
        return self.root / BASELINE_GIT_DIR

    @property
    def markers(self) -> Path:
        return self.root / MARKERS

    @property
    def logs(self) -> Path:
        return self.root / LOGS

    @property
    def agent_home(self) -> Path:
        return self.root / AGENT_HOME

    @property
    def last_message(self) -> Path:
        return self.root / LAST_MESSAGE

    @property
    def patch(self) -> Path:
        return self.root / patch_relpath(self.tag)

    def public(self, name: str) -> Path:
        return self.root / name

    def relative(self, path: Path) -> str:
        """A path for public output: relative to the job root, never absolute."""
        return path.relative_to(self.root).as_posix()


def written_run(root: Path) -> BenchmarkRun | None:
    """The compact run a job root holds, typed; None when there is none (or it is not one)."""
    try:
        return BenchmarkRun.model_validate_json((root / BENCHMARK_RUN).read_bytes())
    except (OSError, ValidationError):
        return None
