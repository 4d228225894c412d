"""``python -m runner evaluate``: patches made anywhere, scored as the official evaluation scores them.

Every verdict is checked against the official way, run by hand in the same test:
``docker run --rm -v DIR:/patches IMAGE bash -c "<ep> apply_patch /patches/P && <ep> test_patched"``,
with the stdout string rule written out here on its own (not imported from the runner).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from runner.settings import IMAGE_REPOSITORY
from tests.conftest import REPO, SESSION, RunningCli, log_events, read_json, run_cli, runner_containers

pytestmark = pytest.mark.docker

ENTRYPOINT = "/usr/local/bin/run_test_entrypoint.sh"
OFFICIAL_SUCCESS = ("PATCH SUCCEEDED", "PATCH SUCCESSFULLY VERIFIED", "FIX SUCCESSFULLY VERIFIED", "NO BUG",
                    "FIX CONFIRMED", "PATCH VERIFIED")
GOLDEN = (REPO / "containers" / "stub" / "golden.patch").read_text()
HANG_TIMEOUT = 5


def _mathops_patch(new_body: list[str], context_line: str = "    return a - b") -> str:
    """A patch of calc/mathops.py's add (whose old line is ``context_line``)."""
    lines = ["--- a/calc/mathops.py", "+++ b/calc/mathops.py", f"@@ -1,6 +1,{5 + len(new_body)} @@",
             ' """Basic arithmetic operations."""', " ", " ", " def add(a, b):",
             '     """Return the sum of a and b."""', f"-{context_line}", *[f"+{line}" for line in new_body]]
    return "\n".join(lines) + "\n"


FIX = _mathops_patch(["    return a + b"])
WRONG = _mathops_patch(["    return a * b"])
NOT_APPLYING = _mathops_patch(["    return a + b"], context_line="    return a / b")
# The first hunk would fix the task; the second does not apply: GNU patch exits 1, and the patch FAILS.
PARTLY = FIX + "--- a/README.md\n+++ b/README.md\n@@ -1,3 +1,3 @@\n-# not the title\n+# calc\n \n A tiny arithmetic package.\n"
HANGS = _mathops_patch(["    while True:", "        pass"])
# Writes marker-like files where a runner might look, and prints success strings on the container's
# stderr only (PID 1's, past the entrypoint's 2>&1): the official rule reads stdout, so it FAILS.
HOSTILE = _mathops_patch([
    "    import os",
    "    for p in ('/patches/attempt.patch.verdict', '/tmp/runner-apply-exit', '/app/result.json', '/tmp/marker.done'):",
    "        try:",
    "            open(p, 'w').write('{\"resolved\": true, \"state\": \"completed\"}')",
    "        except OSError:",
    "            pass",
    "    with open('/proc/1/fd/2', 'w') as err:",
    "        err.write('PATCH SUCCEEDED\\nFIX CONFIRMED\\nrunner-apply-exit:0000:0\\n')",
    "    return a - b",
])


def _official_by_hand(image: str, folder: Path, name: str, timeout: float) -> bool:
    """The official evaluation of one patch, by hand: its exit code and its stdout, the rule applied here."""
    container = f"by-hand-{SESSION}-{uuid.uuid4().hex[:8]}"
    command = ["docker", "run", "--rm", "--name", container, "--network", "none", "-v", f"{folder}:/patches:ro",
               "--entrypoint", "bash", image, "-c",
               f"{ENTRYPOINT} apply_patch /patches/{name} && {ENTRYPOINT} test_patched"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout + 10)
    except subprocess.TimeoutExpired:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True)  # that container only
        return False
    stdout = done.stdout
    return done.returncode == 0 and "FAILED" not in stdout and any(s in stdout for s in OFFICIAL_SUCCESS)


@pytest.fixture
def tag_images(docker_client, stub_image: str, variant_image):
    """Two tags of this session whose default images (the official repository's name) are local:
    the stub, and the stub whose test prints everything on stderr (exit 0, no success on stdout)."""
    made = {}
    for suffix, image in (("a", stub_image), ("b", variant_image("stderr_only"))):
        tag = f"evalstub_{suffix}_{SESSION}"
        docker_client.images.get(image).tag(IMAGE_REPOSITORY, tag)
        made[tag] = image
    yield made
    for tag in made:
        try:
            docker_client.images.remove(f"{IMAGE_REPOSITORY}:{tag}", noprune=True)
        except Exception:
            pass


def _write(folder: Path, patches: dict[str, str | bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in patches.items():
        (folder / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    return folder


def _evaluate(*args: str, timeout: float = 300) -> tuple[int, dict, str]:
    done = run_cli("evaluate", *args, "--eval-network", "none", timeout=timeout)
    try:
        report = json.loads(done.stdout) if done.stdout.strip() else {}
    except ValueError:
        report = {}
    return done.returncode, report, done.stderr


def _rows(ledger: dict) -> dict[str, dict]:
    return {f"{row['tag']}/{row['patch']}": row for row in ledger["rows"]}


def test_every_verdict_is_the_official_rule_run_by_hand(
    tmp_path: Path, tag_images: dict[str, str], no_leaked_containers
) -> None:
    tag_a, tag_b = tag_images
    patches = tmp_path / "Patches"
    _write(patches / tag_a, {
        "golden.patch": GOLDEN, "fix.patch": FIX, "wrong.patch": WRONG, "empty.patch": "",
        "not_applying.patch": NOT_APPLYING, "partly.patch": PARTLY, "hangs.patch": HANGS, "hostile.patch": HOSTILE,
    })
    _write(patches / tag_b, {"golden.patch": GOLDEN, "wrong.patch": WRONG})
    jobs = tmp_path / "out"
    code, report, stderr = _evaluate("--patches-dir", str(patches), "--jobs-dir", str(jobs), "--workers", "3",
                                     "--eval-timeout", str(HANG_TIMEOUT))
    assert code == 0, stderr
    ledger = read_json(jobs / "eval-ledger.json")
    rows = _rows(ledger)
    assert len(rows) == 10 and ledger["schema_version"] == "agentissue_patch_evaluation_v1"
    for key, row in rows.items():
        tag, name = key.split("/")
        by_hand = _official_by_hand(tag_images[tag], patches / tag, name, HANG_TIMEOUT)
        assert row["resolved"] is by_hand, f"{key}: runner {row['resolved']}, by hand {by_hand}"
    a = {name: rows[f"{tag_a}/{name}"] for name in ("golden.patch", "fix.patch", "wrong.patch", "empty.patch",
                                                        "not_applying.patch", "partly.patch", "hangs.patch",
                                                        "hostile.patch")}
    # Not only equal to the by-hand run: what each case must be.
    assert [name for name, row in a.items() if row["resolved"]] == ["golden.patch", "fix.patch"]
    assert a["empty.patch"]["state"] == "rejected" and a["empty.patch"]["label"] == "empty_patch"
    assert a["empty.patch"]["apply_exit_code"] is None  # not run: no container for it
    assert a["not_applying.patch"]["apply_exit_code"] not in (0, None) and a["not_applying.patch"]["test_exit_code"] is None
    assert a["partly.patch"]["apply_exit_code"] == 1 and a["partly.patch"]["test_exit_code"] is None
    assert a["hangs.patch"]["timed_out"] is True and a["hangs.patch"]["label"] == "eval_timeout"
    assert a["hangs.patch"]["wall_seconds"] < HANG_TIMEOUT + 15
    assert a["hostile.patch"]["exit_code_verdict"] is False and a["hostile.patch"]["verdicts_disagree"] is False
    assert a["wrong.patch"]["test_exit_code"] == 1
    b_golden = rows[f"{tag_b}/golden.patch"]
    assert b_golden["exit_code_verdict"] is True and b_golden["string_verdict"] is False
    assert b_golden["verdicts_disagree"] is True and b_golden["resolved"] is False
    for row in rows.values():
        assert len(row["patch_sha256"]) == 64 and row["image_id"].startswith("sha256:")
    # Per tag: successes / patches, the official per-tag score.
    tags = {t["tag"]: t for t in ledger["tags"]}
    assert (tags[tag_a]["successes"], tags[tag_a]["patches"], tags[tag_a]["score"]) == (2, 8, 0.25)
    assert tags[tag_a]["counted"] == 8  # the empty patch is rejected and counts as FAILED
    assert (tags[tag_b]["successes"], tags[tag_b]["patches"]) == (0, 2) and tags[tag_b]["verdicts_disagree"] == 1
    assert ledger["suite"]["successes"] == 2 and ledger["suite"]["patches"] == 10
    assert {n["patch"]: n["successes"] for n in ledger["patch_names"]} == {"golden.patch": 1, "wrong.patch": 0}
    # Nothing private in the public files: no patch text, no host path.
    public = (jobs / "eval-ledger.json").read_text() + (jobs / "eval-ledger.md").read_text()
    assert "add_impl" not in public and "while True" not in public and str(tmp_path) not in public
    assert "| " + tag_a + " | golden.patch | scored | - | yes |" in (jobs / "eval-ledger.md").read_text()
    assert report["suite"] == ledger["suite"]
    assert "1 patches were not run and count as FAILED" in stderr
    # The private logs, per patch: the test's stdout of the hostile one has no success string.
    hostile_test = (jobs / ".eval-logs" / tag_a / "hostile.patch" / "test.log").read_text()
    assert "FAILED" in hostile_test and "PATCH SUCCEEDED" not in hostile_test
    assert "PATCH SUCCEEDED" in (jobs / ".eval-logs" / tag_a / "hostile.patch" / "test.stderr.log").read_text()
    # The report of this very ledger: its score bars are the ledger's per-tag scores; nothing private in it.
    done = run_cli("report", "--jobs-dir", str(jobs), "--out", str(tmp_path / "eval.html"), timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout)["patches"] == 10, done.stderr
    html = (tmp_path / "eval.html").read_text()
    svg = re.search(r'<svg class="chart" data-chart="score-by-tag".*?</svg>', html, re.S)
    assert svg is not None
    bars = dict(re.findall(r'<rect class="bar" data-label="([^"]+)" data-value="([^"]+)"', svg.group(0)))
    assert {tag: float(value) for tag, value in bars.items()} == {tag_a: 0.25, tag_b: 0.0}
    assert "add_impl" not in html and str(tmp_path) not in html


def test_a_rerun_skips_what_is_scored_and_scores_what_changed(
    tmp_path: Path, tag_images: dict[str, str], no_leaked_containers
) -> None:
    tag_a = next(iter(tag_images))
    patches = _write(tmp_path / "Patches" / tag_a, {"golden.patch": GOLDEN, "wrong.patch": WRONG}).parent
    jobs = tmp_path / "out"
    code, _report, stderr = _evaluate("--patches-dir", str(patches), "--jobs-dir", str(jobs))
    assert code == 0, stderr
    first = read_json(jobs / "eval-ledger.json")
    code, report, stderr = _evaluate("--patches-dir", str(patches), "--jobs-dir", str(jobs))
    assert code == 0, stderr
    assert report["call"] == {"units": 2, "scored_now": 0, "skipped_as_scored": 2}
    assert read_json(jobs / "eval-ledger.json") == first
    (patches / tag_a / "wrong.patch").write_text(FIX)  # new bytes under the same name: scored again
    code, report, stderr = _evaluate("--patches-dir", str(patches), "--jobs-dir", str(jobs))
    assert code == 0, stderr
    assert report["call"]["scored_now"] == 1
    assert _rows(read_json(jobs / "eval-ledger.json"))[f"{tag_a}/wrong.patch"]["resolved"] is True


def test_one_patch_and_attempts_give_pass_at_k(tmp_path: Path, tag_images: dict[str, str], no_leaked_containers) -> None:
    tag_a = next(iter(tag_images))
    single = tmp_path / "mine.patch"
    single.write_text(GOLDEN)
    jobs = tmp_path / "out"
    code, report, stderr = _evaluate("--patch", str(single), "--tag", tag_a, "--jobs-dir", str(jobs))
    assert code == 0, stderr
    assert [(r["patch"], r["resolved"]) for r in report["rows"]] == [("mine.patch", True)]
    attempts = _write(tmp_path / "Attempts" / tag_a, {"codex_attempt_1.patch": WRONG, "codex_attempt_2.patch": FIX,
                                                      "codex_attempt_3.patch": WRONG}).parent
    code, report, stderr = _evaluate("--patches-dir", str(attempts), "--jobs-dir", str(tmp_path / "out2"),
                                     "--workers", "3")
    assert code == 0, stderr
    assert sorted(r["attempt"] for r in report["rows"]) == [1, 2, 3]
    (summary,) = report["pass_at"]["tasks"]
    assert (summary["scored"], summary["resolved"]) == (3, 1)
    assert summary["pass_at"]["1"] == pytest.approx(1 / 3, abs=1e-6) and summary["pass_at"]["3"] == 1.0


def _ledger_facts(path: Path) -> dict[str, tuple]:
    """What a ledger says of each patch, without the durations (which no two runs share)."""
    return {key: (row["state"], row["label"], row["resolved"], row["exit_code_verdict"], row["apply_exit_code"],
                  row["test_exit_code"], row["timed_out"], row["patch_sha256"])
            for key, row in _rows(read_json(path)).items()}


def test_a_killed_evaluate_resumes_to_the_same_ledger(
    tmp_path: Path, tag_images: dict[str, str], docker_client, no_leaked_containers
) -> None:
    tag_a = next(iter(tag_images))
    patches = _write(tmp_path / "Patches" / tag_a, {
        "golden.patch": GOLDEN, "wrong.patch": WRONG, "hangs.patch": HANGS, "fix.patch": FIX,
        "hangs2.patch": HANGS, "empty.patch": "",
    }).parent
    flags = ("--patches-dir", str(patches), "--eval-timeout", "4", "--eval-network", "none", "--workers", "2")
    unkilled = tmp_path / "unkilled"
    code, _report, stderr = _evaluate(*flags[:-2], "--jobs-dir", str(unkilled))
    assert code == 0, stderr
    killed = tmp_path / "killed"
    running = RunningCli("evaluate", *flags, "--jobs-dir", str(killed))
    running.wait_for("evaluate_container_started")
    time.sleep(0.5)
    os.kill(running.process.pid, signal.SIGKILL)
    assert running.finish()[0] == -signal.SIGKILL
    sweep = run_cli("--sweep")
    assert sweep.returncode == 0, sweep.stderr
    assert runner_containers(docker_client) == []  # the sweep found the dead call's containers
    code, report, stderr = _evaluate(*flags, "--jobs-dir", str(killed))
    assert code == 0, stderr
    assert report["call"]["units"] == 6
    assert _ledger_facts(killed / "eval-ledger.json") == _ledger_facts(unkilled / "eval-ledger.json")


def test_sigterm_removes_every_container_and_the_rerun_resumes(
    tmp_path: Path, tag_images: dict[str, str], docker_client, no_leaked_containers
) -> None:
    tag_a = next(iter(tag_images))
    patches = _write(tmp_path / "Patches" / tag_a, {f"hangs{i}.patch": HANGS for i in range(3)}).parent
    jobs = tmp_path / "out"
    flags = ("--patches-dir", str(patches), "--jobs-dir", str(jobs), "--eval-timeout", "60", "--eval-network", "none",
             "--workers", "3")
    running = RunningCli("evaluate", *flags)
    deadline = time.monotonic() + 60
    while len(log_events(running.lines, "evaluate_container_started")) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(runner_containers(docker_client)) >= 3
    started = time.monotonic()
    running.process.send_signal(signal.SIGTERM)
    code, _stdout, stderr = running.finish(timeout=60)
    assert code == 130, stderr
    assert time.monotonic() - started < 20  # not the 60 s deadline: the containers were removed
    assert "evaluate interrupted" in stderr
    assert runner_containers(docker_client) == []  # without a sweep
    assert not (jobs / "eval-ledger.json").exists() or read_json(jobs / "eval-ledger.json")["rows"] == []
    code, report, stderr = _evaluate("--patches-dir", str(patches), "--jobs-dir", str(jobs), "--eval-timeout", "3",
                                     "--workers", "3")
    assert code == 0, stderr
    assert [r["timed_out"] for r in report["rows"]] == [True, True, True]


def test_bad_input_is_refused_with_nothing_lost(tmp_path: Path, tag_images: dict[str, str]) -> None:
    tag_a = next(iter(tag_images))
    jobs = tmp_path / "out"
    code, _r, stderr = _evaluate("--patches-dir", str(tmp_path / "nowhere"), "--jobs-dir", str(jobs))
    assert code == 2 and "--patches-dir is not a directory" in stderr and "Traceback" not in stderr
    bad = tmp_path / "bad"
    _write(bad / "not a tag;rm -rf", {"x.patch": GOLDEN})
    code, _r, stderr = _evaluate("--patches-dir", str(bad), "--jobs-dir", str(jobs))
    assert code == 2 and "'not a tag;rm -rf' is not a tag" in stderr
    code, _r, stderr = _evaluate("--patch", str(tmp_path / "x.patch"), "--jobs-dir", str(jobs))
    assert code == 2 and "exactly one --tag" in stderr
    code, _r, stderr = _evaluate("--patches-dir", str(bad), "--jobs-dir", str(jobs), "--workers", "0")
    assert code == 2 and "--workers" in stderr
    assert not (jobs / "eval-ledger.json").exists()
    # A spelling of a tag is mapped and shown; a tag whose image is missing is an infrastructure failure (exit 3).
    mixed = tmp_path / "mixed"
    _write(mixed / "evo.ninja_445", {"a.patch": GOLDEN})
    _write(mixed / tag_a, {"golden.patch": GOLDEN, "notes.patch": "just some notes\n"})
    with (mixed / tag_a / "big.patch").open("wb") as handle:
        handle.truncate(65 * 1024 * 1024)  # sparse: over the 64 MiB limit without writing it
    code, report, stderr = _evaluate("--patches-dir", str(mixed), "--jobs-dir", str(jobs), "--allow-unscorable")
    assert code == 3, stderr
    assert report["tag_directories"] == {"evo.ninja_445": "evoninja_445"}
    rows = _rows(report)
    assert rows["evoninja_445/a.patch"]["state"] == "infra_failed" and rows["evoninja_445/a.patch"]["label"] == "image_missing"
    assert rows["evoninja_445/a.patch"]["directory"] == "evo.ninja_445"
    assert (rows[f"{tag_a}/big.patch"]["state"], rows[f"{tag_a}/big.patch"]["label"]) == ("rejected", "patch_too_large")
    assert (rows[f"{tag_a}/notes.patch"]["state"], rows[f"{tag_a}/notes.patch"]["label"]) == ("rejected", "not_a_patch")
    assert rows[f"{tag_a}/golden.patch"]["resolved"] is True
    assert "could not be run (image_missing); rerun to retry them" in stderr
    assert "evo.ninja_445 -> evoninja_445" in (jobs / "eval-ledger.md").read_text()
