"""The fleet's evaluation units against a real Redis and a real Docker Engine: a worker process scores a
patches dir, and every verdict equals what ``python -m runner evaluate`` gives on the same dir."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, log_events, read_json, run_cli
from tests.fleet_support import Fleet

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.usefixtures("no_leaked_containers")]

GOLDEN = (REPO / "containers" / "stub" / "golden.patch").read_text()
WRONG = GOLDEN.replace("+    return a + b", "+    return a * b")
TAG = "t_eval"
COMPARED = ("tag", "patch", "state", "label", "resolved", "exit_code_verdict", "string_verdict", "apply_exit_code",
            "test_exit_code", "patch_sha256", "patch_bytes")


def test_the_fleet_scores_a_patches_dir_as_evaluate_does_and_a_resubmission_adds_nothing(fleet: Fleet) -> None:
    assert WRONG != GOLDEN
    patches = fleet.tmp / "Patches"
    (patches / TAG).mkdir(parents=True)
    (patches / TAG / "golden.patch").write_text(GOLDEN)
    (patches / TAG / "wrong.patch").write_text(WRONG)
    (patches / TAG / "empty.patch").write_text("")
    common = ("--patches-dir", str(patches), "--image", fleet.image, "--eval-network", "none")

    worker = fleet.worker("host-a", fleet.jobs("host-a"), "--slots", "2")
    done = run_cli("submit", "--broker", fleet.url, "--namespace", fleet.namespace, "--suite", "ev", *common)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["kind"] == "eval" and report["queued"] == 3 and report["rejected"] == [f"{TAG}/empty.patch"]
    keys = {f"{TAG}/golden.patch", f"{TAG}/wrong.patch", f"{TAG}/empty.patch"}
    fleet.wait("every unit done", lambda: set(fleet.rows("ev")) == keys
               and all(r["state"] == "done" for r in fleet.rows("ev").values()), timeout=180)

    jobs = fleet.jobs("evaluate-out")
    by_evaluate = run_cli("evaluate", *common, "--jobs-dir", str(jobs), timeout=300)
    assert by_evaluate.returncode == 0, by_evaluate.stderr
    expected = {f"{r['tag']}/{r['patch']}": r for r in read_json(jobs / "eval-ledger.json")["rows"]}

    status = fleet.status("--suite", "ev")
    assert status.returncode == 0, status.stderr
    suite = json.loads(status.stdout)["suites"][0]
    rows = {f"{r['tag']}/{r['patch']}": r for r in suite["rows"]}
    assert set(rows) == keys and {r["kind"] for r in rows.values()} == {"eval"}
    assert {k: r["resolved"] for k, r in rows.items()} == {
        f"{TAG}/golden.patch": True, f"{TAG}/wrong.patch": False, f"{TAG}/empty.patch": False}
    fleet_rows = {f"{r['tag']}/{r['patch']}": r for r in suite["evaluation"]["rows"]}
    assert set(fleet_rows) == set(expected) == keys
    for key in keys:
        assert {f: fleet_rows[key][f] for f in COMPARED} == {f: expected[key][f] for f in COMPARED}, key
        assert rows[key]["resolved"] is expected[key]["resolved"] and rows[key]["host"] == "host-a"
    assert fleet_rows[f"{TAG}/empty.patch"]["state"] == "rejected"
    assert fleet_rows[f"{TAG}/empty.patch"]["apply_exit_code"] is None  # no container for it, as evaluate
    evaluated = read_json(jobs / "eval-ledger.json")
    assert [{k: t[k] for k in ("tag", "patches", "successes", "score")} for t in suite["evaluation"]["tags"]] == [
        {k: t[k] for k in ("tag", "patches", "successes", "score")} for t in evaluated["tags"]] == [
        {"tag": TAG, "patches": 3, "successes": 1, "score": round(1 / 3, 6)}]
    assert str(fleet.tmp) not in status.stdout
    markdown = fleet.status("--suite", "ev", "--format", "markdown").stdout
    assert f"| eval | {TAG} | 1 | golden.patch | done | host-a |" in markdown
    assert f"| {TAG} | 3 | 1 | 0.333 |" in markdown

    html = fleet.tmp / "report.html"
    made = run_cli("report", "--suite", "ev", "--broker", fleet.url, "--namespace", fleet.namespace, "--out", str(html))
    assert made.returncode == 0, made.stderr
    page = html.read_text()
    assert "<th>kind</th>" in page and "<td>eval</td>" in page and "golden.patch" in page

    again = run_cli("submit", "--broker", fleet.url, "--namespace", fleet.namespace, "--suite", "ev", *common)
    assert json.loads(again.stdout)["queued"] == 0 and json.loads(again.stdout)["skipped_existing"] == 3
    # Changed bytes under the same name are a new unit: scored again.
    (patches / TAG / "wrong.patch").write_text(GOLDEN.replace("+    return a + b", "+    return b + a"))
    changed = run_cli("submit", "--broker", fleet.url, "--namespace", fleet.namespace, "--suite", "ev", *common)
    assert json.loads(changed.stdout)["queued"] == 1, changed.stdout
    fleet.wait("the changed patch re-scored", lambda: fleet.rows("ev")[f"{TAG}/wrong.patch"]["state"] == "done"
               and fleet.rows("ev")[f"{TAG}/wrong.patch"]["resolved"] is True, timeout=120)
    time.sleep(1)
    assert len(log_events(list(worker.lines), "task_started")) == 4, "nothing scored is run again"
    code, stdout, stderr = fleet.stop(worker)
    assert code == 0, stderr[-2000:]
    assert json.loads(stdout)["finished"] == {"done": 4}


def test_submit_refuses_a_bad_patches_dir_before_queueing_anything(fleet: Fleet) -> None:
    base = ("submit", "--broker", fleet.url, "--namespace", fleet.namespace, "--suite", "bad")
    missing = run_cli(*base, "--patches-dir", str(fleet.tmp / "nowhere"))
    assert missing.returncode == 2 and "--patches-dir is not a directory" in missing.stderr + missing.stdout
    patches = fleet.tmp / "P"
    (patches / "not a tag").mkdir(parents=True)
    refused = run_cli(*base, "--patches-dir", str(patches))
    assert refused.returncode == 2 and "is not a tag" in refused.stderr + refused.stdout
    (patches / "not a tag").rmdir()
    (patches / TAG).mkdir()
    (patches / TAG / "x.patch").write_text(GOLDEN)
    other = run_cli(*base, "--patches-dir", str(patches), "--tag", "t_other")
    assert other.returncode == 2 and "has no directory for t_other" in other.stderr + other.stdout
    assert fleet.rows("bad") == {}
    assert not fleet.client.keys(f"{fleet.namespace}:dq:*"), "nothing queued"
