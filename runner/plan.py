"""The plan: what a run would do, in phase order, with argv shapes and relative paths.

Pure: builds a dict from settings; touches no file, no container, no process.
"""

from __future__ import annotations

from typing import Any

from reducers.models import PHASE_ORDER, Phase
from runner import jobroot
from runner.agents import AgentName
from runner.agents.claude_code import claude_argv, confined
from runner.agents.codex import codex_argv
from runner.settings import PATCH_IN_CONTAINER, RunnerSettings

_WHAT = {
    Phase.PREPARE: "check context/prompt.md (present, non-empty, not the synthetic placeholder); lay out the job root",
    Phase.PRECHECK: "codex --version; codex login (or the provider key variable); Docker daemon answers; image present (pulled only with --allow-pull); "
    "layout probe in a throwaway container",
    Phase.EXTRACT: "create (never start) a container; stream get_archive(source dir) into the safe extractor, "
    "leaving .git out; remove the container; ended at --extract-timeout (extract_timeout, exit 3)",
    Phase.BASELINE: "git init, local identity, add everything, one baseline commit (GitPython); "
    "its own --extract-timeout deadline kills git (baseline_timeout, exit 3)",
    Phase.CODEX: "codex exec with the prompt on stdin, in buggy-source only, allowlisted environment, "
    "process-group deadline",
    Phase.PATCH: "diff of the work tree (new files included) against the baseline, for patch -p1",
    Phase.EVALUATE: "fresh container of the extracted image id; the patch on its stdin (put_archive where that "
    "cannot work); its own process runs apply, then (only if apply exits 0) the test; resolved by the official rule (exit code 0 from the daemon, "
    "no FAILED and a success string in stdout); a network probe beside it; remove",
    Phase.REDUCE: "markers to the compact public JSON, each through the public guard",
}


def build_plan(settings: RunnerSettings) -> dict[str, Any]:
    patch = jobroot.patch_relpath(settings.tag)
    argv = {
        Phase.CODEX: codex_argv(  # type: ignore[arg-type]
            settings.codex_bin, jobroot.BUGGY_SOURCE, jobroot.LAST_MESSAGE,
            model=settings.model, profile=settings.codex_profile, overrides=settings.codex_config,
        ) if settings.agent is AgentName.CODEX else confined(
            claude_argv(settings.claude_bin, model=settings.model), "bwrap", (jobroot.BUGGY_SOURCE, jobroot.AGENT_HOME),
        ),
        Phase.EXTRACT: ["containers.create", settings.resolved_image, "get_archive", settings.source_dir],
        Phase.EVALUATE: [
            ["containers.create", settings.resolved_image, "entrypoint", "/bin/sh", "-c", "<gate>",
             settings.apply_cmd, settings.test_cmd, "<nonce>", PATCH_IN_CONTAINER, "<patch bytes>"],
            ["attach", "stdin: the patch, then closed", "stdout", "stderr"],
            ["start", "then wait: the gate runs", "bash", "-c", settings.apply_cmd,
             "then, only if it exits 0,", "bash", "-c", settings.test_cmd],
            ["logs", "split at the gate's status line", "logs/eval-apply.log", "logs/eval-test.log"],
        ],
    }
    return {
        "mode": "plan",
        "touches_nothing": True,
        "tag": settings.tag,
        "image": settings.resolved_image,
        "eval_network": settings.eval_network.value,
        "eval_probe": list(settings.probe_endpoints),
        "agent": settings.agent.value,
        "tag_profile": settings.profile.name if settings.profile else None,
        "from_profile": list(settings.profile_fields),
        "codex_timeout_seconds": settings.codex_timeout,
        "max_tokens": settings.max_tokens,
        "max_cost_usd": settings.max_cost_usd,
        "extract_timeout_seconds": settings.extract_timeout,
        "eval_timeout_seconds": settings.eval_timeout,
        "phases": [
            {
                "phase": phase.value,
                "does": _WHAT[phase],
                "marker": f"{jobroot.MARKERS}/{phase.value}.json",
                **({"argv": argv[phase]} if phase in argv else {}),
            }
            for phase in PHASE_ORDER
        ],
        "job_root_layout": {
            "prompt": jobroot.PROMPT,
            "buggy_source": f"{jobroot.BUGGY_SOURCE}/",
            "patch": patch,
            "markers": f"{jobroot.MARKERS}/",
            "logs": f"{jobroot.LOGS}/",
            "codex_last_message": jobroot.LAST_MESSAGE,
            "public": list(jobroot.PUBLIC_FILES),
        },
    }
