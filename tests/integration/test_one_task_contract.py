"""One task contract: a tag is run and scored the same whether it runs alone, in a batch or on the fleet.

Real processes throughout (``--execute``, a batch, a worker on a real Redis), a real Docker
Engine and one stub variant with the entry script where every profile below looks for it.
Each task's process logs what it resolved (``task_settings_resolved``, in its private log);
those, and the evaluation's network in the compact run, must agree across the three drivers
and be the tag's own profile's, not the default tag's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FAKE_CODEX, log_events, read_json, run_cli
from tests.fleet_support import Fleet

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.usefixtures("no_leaked_containers")]

PROMPT = "Fix calc.add.\nfake-codex-mode: fix\n"
# The profile each tag must get, whoever runs it: entry script, network and deadline all differ.
EXPECTED = {
    "lagent_239": ("/usr/local/bin/run_test_entrypoint.sh", "bridge", 300.0),
    "agixt_1369": ("/app/run_test_entrypoint.sh", "host", 3600.0),
    "superagent_953": ("/opt/run_test_entrypoint.sh", "bridge", 300.0),
}
TAGS = list(EXPECTED)


def _resolved(lines: str | list[str]) -> dict[str, Any]:
    events = log_events(lines, "task_settings_resolved")
    assert len(events) == 1, f"{len(events)} task_settings_resolved events"
    return {k: v for k, v in events[0].items() if k not in ("timestamp", "level", "run_id", "logger")}


def _prompts(root: Path) -> Path:
    for tag in TAGS:
        (root / tag / "context").mkdir(parents=True, exist_ok=True)
        (root / tag / "context" / "prompt.md").write_text(PROMPT)
    return root


def test_a_tag_runs_with_its_own_profile_alone_in_a_batch_and_on_the_fleet(
    fleet: Fleet, tmp_path: Path, variant_image
) -> None:
    image = variant_image("every_entrypoint")
    resolved: dict[str, dict[str, dict[str, Any]]] = {"alone": {}, "batch": {}, "fleet": {}}
    networks: dict[str, dict[str, str]] = {"alone": {}, "batch": {}, "fleet": {}}

    alone = _prompts(tmp_path / "alone")
    for tag in TAGS:
        done = run_cli("--execute", "--job-root", str(alone / tag), "--tag", tag, "--image", image,
                       "--codex-bin", str(FAKE_CODEX))
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout)["resolved"] is True
        resolved["alone"][tag] = _resolved(done.stderr)
        networks["alone"][tag] = read_json(alone / tag / "benchmark_run.compact.json")["evaluation"]["network"]

    batch = _prompts(tmp_path / "batch")
    done = run_cli("--execute", "--jobs-dir", str(batch), *[arg for tag in TAGS for arg in ("--tag", tag)],
                   "--image", image, "--codex-bin", str(FAKE_CODEX), "--workers", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["resolved"] == 3
    for tag in TAGS:
        resolved["batch"][tag] = _resolved((batch / ".batch-logs" / f"{tag}.log").read_text())
        networks["batch"][tag] = read_json(batch / tag / "benchmark_run.compact.json")["evaluation"]["network"]

    for tag in TAGS:
        fleet.prompt(tag, PROMPT)
    jobs = fleet.jobs("host-a")
    worker = fleet.worker("host-a", jobs, "--slots", "3")
    assert fleet.submit("contract", *[arg for tag in TAGS for arg in ("--tag", tag)], image=image).returncode == 0
    for tag in TAGS:
        row = fleet.wait_state("contract", f"{tag}/1", "done", timeout=180)
        assert row["resolved"] is True and row["infra_failure"] is False
        resolved["fleet"][tag] = _resolved((jobs / "contract" / ".worker-logs" / f"{tag}.attempt-1.log").read_text())
        compact = jobs / "contract" / tag / "attempt-1" / "benchmark_run.compact.json"
        networks["fleet"][tag] = read_json(compact)["evaluation"]["network"]
    code, _stdout, stderr = fleet.stop(worker)
    assert code == 0, stderr[-2000:]

    for tag, (entry, network, timeout) in EXPECTED.items():
        alone_view = resolved["alone"][tag]
        assert resolved["batch"][tag] == alone_view == resolved["fleet"][tag], tag
        assert alone_view["apply_cmd"] == f"{entry} apply_patch /patches/attempt.patch"
        assert alone_view["test_cmd"] == f"{entry} test_patched"
        assert (alone_view["eval_network"], alone_view["eval_timeout"]) == (network, timeout)
        assert {networks[driver][tag] for driver in networks} == {network}, (tag, networks)


def test_submit_hands_the_model_codex_config_and_patch_excludes_to_the_workers_codex(fleet: Fleet) -> None:
    """Every task flag reaches a fleet task unchanged: the codex the worker runs gets them, and the patch obeys."""
    fleet.prompt("t_pinned", "Fix calc.add.\nfake-codex-mode: fix\nfake-codex-record-argv: yes\n")
    jobs = fleet.jobs("host-a")
    worker = fleet.worker("host-a", jobs)
    submitted = fleet.submit("pinned", "--tag", "t_pinned", "--model", "gpt-pinned-1",
                             "--codex-config", "model_reasoning_effort=low", "--patch-exclude", "fake-codex-argv.json",
                             "--eval-probe", "127.0.0.1:9")
    assert submitted.returncode == 0, submitted.stderr
    row = fleet.wait_state("pinned", "t_pinned/1", "done", timeout=180)
    assert row["resolved"] is True
    job = jobs / "pinned" / "t_pinned" / "attempt-1"
    argv = json.loads((job / "buggy-source" / "fake-codex-argv.json").read_text())
    assert argv[argv.index("--model") + 1] == "gpt-pinned-1"
    overrides = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-c"]
    assert overrides[0] == "model_reasoning_effort=low", "the operator's override, before the runner's guards"
    patch = (job / "Patches" / "t_pinned" / "attempt.patch").read_text()
    assert "fake-codex-argv.json" not in patch and "calc/mathops.py" in patch
    run = read_json(job / "benchmark_run.compact.json")
    assert run["codex"]["model"] == "gpt-pinned-1" and run["artifact_files_left_out"] >= 1
    # The declared mirror reached the task (t_pinned needs no network, so it is not probed).
    resolved = _resolved((jobs / "pinned" / ".worker-logs" / "t_pinned.attempt-1.log").read_text())
    assert resolved["eval_probe"] == ["127.0.0.1:9"]
    assert run["evaluation"]["network_probe"] == "skipped_not_needed" and run["evaluation"]["network_probed"] == []
    code, _stdout, stderr = fleet.stop(worker)
    assert code == 0, stderr[-2000:]
