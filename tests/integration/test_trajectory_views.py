"""The private views (``show``, ``export --format atif``, ``report --private``) on real codex runs.

Every attempt here is ``python -m runner --execute`` with the real Codex CLI against the scripted
model on the stub image, as in test_real_codex.py; the views then read the job roots it left.
The scripted turns are the expectation: ``show`` must list exactly them, with the exit codes
the commands really had; the ATIF export must validate and carry the tokens the runner counted.
An agent message plants a secret-looking key and a host path: the private report shows them,
and no public file, page or metric does.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from runner.canary.model_server import KEY_VARIABLE, ScriptedModel, exec_call, fault, message, turn, write_codex_home
from runner.canary.run import RUN_THE_CHECK, fix_call
from runner.codex_usage import TokenCounts
from runner.trajectory.atif import tokens_of, validate_atif
from runner.views.model import HealthReport, HostCheck, SnapshotSource
from runner.views.public import view_private_texts
from runner.views.server import BackgroundServer
from runner.views.sources import rows_from_jobs_dir
from tests.conftest import REPO, cli_environment, read_json, run_cli
from tests.integration.test_real_codex import real_codex  # noqa: F401 (a fixture)
from tests.views_support import chromium_or_skip, dump_dom, keep_for_readme, screenshot

pytestmark = [pytest.mark.docker, pytest.mark.real_codex, pytest.mark.usefixtures("no_leaked_containers")]

SECRET = "sk-live-" + secrets.token_hex(16)
PROMPT = "Fix calc.mathops.add so that it returns the sum.\nThe tests are in tests/.\n"
CHECK_AGAIN = "echo checking again; exit 3"
TAG = "stub_calc"


def script(host_path: str) -> list[dict]:
    return [
        turn(message("Reading the code first."), exec_call("cat calc/mathops.py")),
        turn(fix_call()),
        turn(exec_call(RUN_THE_CHECK)),
        turn(exec_call(CHECK_AGAIN)),
        turn(message(f"Fixed. The key {SECRET} sits in {host_path}/notes.txt")),
    ]


# What show must list for that script: per step, its messages and (command, exit code)s and files.
def expected_steps(host_path: str) -> list[tuple[list[str], list[tuple[str, int]], list[str]]]:
    return [
        (["Reading the code first."], [("cat calc/mathops.py", 0)], []),
        ([], [], ["calc/mathops.py"]),
        ([], [(RUN_THE_CHECK, 0)], []),
        ([], [(CHECK_AGAIN, 3)], []),
        ([f"Fixed. The key {SECRET} sits in {host_path}/notes.txt"], [], []),
    ]


@dataclass
class Suite:
    jobs: Path
    done: subprocess.CompletedProcess
    host_path: str

    def root(self, attempt: int) -> Path:
        return self.jobs / TAG / f"attempt-{attempt}"


def _execute(args: list[str], model: ScriptedModel, home_dir: Path, codex: Path, image: str) -> list[str]:
    home = write_codex_home(home_dir, model.base_url, idle_timeout_ms=3000)
    return ["--execute", *args, "--image", image, "--codex-bin", str(codex), f"--codex-home={home}",
            "--codex-timeout=120"]


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory, stub_image: str, real_codex: Path) -> Suite:  # noqa: F811
    base = tmp_path_factory.mktemp("trajectory")
    jobs = base / "jobs"
    (jobs / TAG / "context").mkdir(parents=True)
    (jobs / TAG / "context" / "prompt.md").write_text(PROMPT)
    host_path = str(jobs)  # an absolute host path, the jobs dir itself
    with ScriptedModel(script(host_path), per_conversation=True) as model:
        done = run_cli(*_execute(["--jobs-dir", str(jobs), "--tag", TAG, "--attempts", "2", "--workers", "1"],
                                 model, base / "codex-home", real_codex, stub_image), env={KEY_VARIABLE: "sk-scripted-key"})
    assert done.returncode == 0, done.stderr[-3000:]
    return Suite(jobs, done, host_path)


def _show(*args: str) -> subprocess.CompletedProcess:
    return run_cli("show", *args)


def _parsed_steps(text: str) -> list[tuple[list[str], list[tuple[str, int]], list[str]]]:
    steps: list[tuple[list[str], list[tuple[str, int]], list[str]]] = []
    for line in text.splitlines():
        if re.match(r"^step \d+", line):
            steps.append(([], [], []))
        elif steps and line.startswith("  agent: "):
            steps[-1][0].append(line.removeprefix("  agent: "))
        elif steps and (found := re.match(r"^  \$ (.*?)(?: \[test\])?  -> exit (-?\d+)", line)):
            steps[-1][1].append((found.group(1), int(found.group(2))))
        elif steps and (found := re.match(r"^  ~ \w+ (.*)$", line)):
            steps[-1][2].append(found.group(1))
    return steps


def test_show_lists_exactly_the_scripted_turns_commands_and_exit_codes(suite: Suite) -> None:
    for attempt in (1, 2):
        shown = _show("--jobs-dir", str(suite.jobs), "--tag", TAG, "--attempt", str(attempt))
        assert shown.returncode == 0, shown.stderr
        text = shown.stdout
        steps = _parsed_steps(text)
        assert steps == expected_steps(suite.host_path)  # file paths relative to the agent's tree
        assert text.splitlines()[0] == f"attempt {TAG}: resolved"
        assert "  | Fix calc.mathops.add so that it returns the sum." in text
        # tokens per step (the scripted model's 100/40/20/5 each) and the total of five responses
        assert text.count("tokens in 100 (cached 40) out 20 (reasoning 5)") == 5
        assert "tokens in 500 (cached 200) out 100 (reasoning 25)" in text
        assert "patch: 1 files, +1 -1" in text
        assert "evaluation: apply exit 0, test exit 0" in text
        assert "official verdict: resolved; exit-code verdict: pass" in text
        assert "--- eval-test.log (last lines)" in text
        assert re.search(r"^time: prepare [\d.]+s, precheck .* evaluate [\d.]+s, reduce", text, re.M)
        # the failed command's duration and exit code come from codex itself
        assert re.search(r"\$ echo checking again; exit 3  -> exit 3 \d+\.\d\ds", text)
    # --job-root gives the same
    same = _show("--job-root", str(suite.root(1)))
    assert same.stdout == _show("--jobs-dir", str(suite.jobs), "--tag", TAG, "--attempt", "1").stdout


def test_show_refuses_what_is_not_an_attempt(suite: Suite, tmp_path: Path) -> None:
    missing = _show("--job-root", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "is not a directory" in missing.stderr
    empty = _show("--job-root", str(tmp_path))
    assert empty.returncode == 2 and "no attempt here" in empty.stderr
    several = _show("--jobs-dir", str(suite.jobs), "--tag", TAG)
    assert several.returncode == 2 and "has 2 attempts" in several.stderr
    both = _show("--job-root", str(tmp_path), "--jobs-dir", str(suite.jobs))
    assert both.returncode == 2
    no_stream = run_cli("export", "--format", "atif", "--job-root", str(_bare_attempt(tmp_path)))
    assert no_stream.returncode == 2 and "no codex event stream" in no_stream.stderr


def _bare_attempt(tmp_path: Path) -> Path:
    job = tmp_path / "bare"
    (job / "context").mkdir(parents=True)
    (job / "context" / "prompt.md").write_text("nothing ran\n")
    return job


def test_export_atif_validates_and_round_trips_the_tokens(suite: Suite, tmp_path: Path) -> None:
    out = tmp_path / "one.json"
    done = run_cli("export", "--format", "atif", "--jobs-dir", str(suite.jobs), "--tag", TAG, "--attempt", "1",
                   "--out", str(out))
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    trajectory = validate_atif(document)
    assert trajectory.schema_version == "ATIF-v1.4" and trajectory.agent.name == "codex"
    assert [s.source for s in trajectory.steps] == ["user", *["agent"] * 5]
    assert trajectory.steps[0].message == PROMPT
    calls = [(c.function_name, c.arguments) for s in trajectory.steps for c in s.tool_calls or []]
    assert calls[0] == ("exec_command", {"cmd": "cat calc/mathops.py"})
    assert calls[1] == ("apply_patch", {"changes": [{"path": "calc/mathops.py", "kind": "update"}]})
    assert calls[2:] == [("exec_command", {"cmd": RUN_THE_CHECK}), ("exec_command", {"cmd": CHECK_AGAIN})]
    assert "CHECK-PASSED" in trajectory.steps[3].observation.results[0].content
    assert trajectory.steps[4].extra["tool_runs"][trajectory.steps[4].tool_calls[0].tool_call_id]["exit_code"] == 3
    # the tokens: what the runner counted and published, the per-step sum, and back out of the document
    metrics = read_json(suite.root(1) / "benchmark_run.compact.json")["metrics"]
    counted = TokenCounts(input_tokens=metrics["input_tokens"], cached_input_tokens=metrics["cache_tokens"],
                          output_tokens=metrics["output_tokens"], reasoning_output_tokens=metrics["reasoning_tokens"])
    assert tokens_of(document) == counted == TokenCounts(500, 200, 0, 100, 25)
    steps = [s.metrics for s in trajectory.steps if s.metrics]
    assert sum(m.prompt_tokens for m in steps) == 500 and sum(m.cached_tokens for m in steps) == 200
    assert sum(m.completion_tokens for m in steps) == 100
    # the ATIF validator is able to fail: a broken reference and a renumbered step are refused
    broken = json.loads(out.read_text())
    broken["steps"][2]["observation"]["results"][0]["source_call_id"] = "no-such-call"
    with pytest.raises(Exception, match="names no tool call"):
        validate_atif(broken)
    broken = json.loads(out.read_text())
    broken["steps"][1]["step_id"] = 7
    with pytest.raises(Exception, match="sequential"):
        validate_atif(broken)
    # a whole jobs dir: one file per attempt
    every = run_cli("export", "--format", "atif", "--jobs-dir", str(suite.jobs), "--out", str(tmp_path / "all"))
    assert every.returncode == 0, every.stderr
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == [
        f"{TAG}.attempt-1.trajectory.json", f"{TAG}.attempt-2.trajectory.json"]


def _public_texts(suite: Suite, tmp_path: Path) -> dict[str, str]:
    """Every public output of the suite: its public files, the public report, the status page, /metrics."""
    found = {}
    for path in suite.jobs.rglob("*"):
        if path.is_file() and (path.name.endswith((".compact.json", ".public.json")) or path.name.startswith("run-ledger")):
            found[str(path.relative_to(suite.jobs))] = path.read_text(errors="replace")
    assert len([name for name in found if name.endswith(".compact.json")]) == 4
    public = tmp_path / "report.html"
    done = run_cli("report", "--jobs-dir", str(suite.jobs), "--out", str(public))
    assert done.returncode == 0, done.stderr
    found["report.html"] = public.read_text()
    health = HealthReport(checks=[HostCheck(name="docker", ok=True)], taking_work=False, slots_busy=0, slots_total=1)
    source = SnapshotSource(health, rows_from_jobs_dir(suite.jobs))
    with BackgroundServer(source, private_texts=view_private_texts([str(suite.jobs)]), title="suite") as views:
        for page in ("/", "/metrics", "/private-report.html", "/report"):
            try:
                with urllib.request.urlopen(views.url + page, timeout=10) as answer:
                    found[page] = answer.read().decode(errors="replace")
            except urllib.error.HTTPError as e:  # the worker's page serves no private report
                assert e.code == 404, page
                found[page] = e.read().decode(errors="replace")
    return found


def test_a_planted_secret_and_host_path_are_in_the_private_report_only(suite: Suite, tmp_path: Path) -> None:
    private = tmp_path / "private-report.html"
    done = run_cli("report", "--private", "--jobs-dir", str(suite.jobs), "--out", str(private))
    assert done.returncode == 0, done.stderr
    text = private.read_text()
    assert SECRET in text and f"{suite.host_path}/notes.txt" in text
    assert text.splitlines()[0].startswith("<!-- PRIVATE runner report")
    assert "<title>PRIVATE: local batch</title>" in text
    assert oct(private.stat().st_mode & 0o777) == "0o600"
    for name, public in _public_texts(suite, tmp_path).items():
        assert SECRET not in public, f"the planted key leaked into {name}"
        assert suite.host_path not in public, f"the host path leaked into {name}"
        assert "private-report" not in public, f"{name} names the private report"
    # a file name that does not say private is refused, and nothing is written
    refused = run_cli("report", "--private", "--jobs-dir", str(suite.jobs), "--out", str(tmp_path / "report2.html"))
    assert refused.returncode == 2 and "must say so" in refused.stderr
    assert not (tmp_path / "report2.html").exists()


def test_the_private_report_opens_in_chromium_with_every_attempt(suite: Suite, tmp_path: Path) -> None:
    chromium_or_skip()
    private = tmp_path / "private-report.html"
    assert run_cli("report", "--private", "--jobs-dir", str(suite.jobs), "--out", str(private)).returncode == 0
    dom = dump_dom(private.as_uri(), tmp_path / "chromium-dom")
    for attempt in (1, 2):
        section = dom.split(f'id="attempt-{TAG}-{attempt}"', 1)[1].split("</section>", 1)[0]
        assert "step 5" in section and "$ echo checking again; exit 3  -&gt; exit 3" in section
        assert "-    return a - b" in section and "+    return a + b" in section  # the coloured patch
        assert 'data-log="eval-test.log"' in section
    assert dom.count('class="attempt"') == 2
    png = tmp_path / "private-report.png"
    dims = screenshot(private.as_uri(), tmp_path / "chromium-shot", png, (1280, 2600))
    assert dims == (1280, 2600) and png.stat().st_size > 25_000
    keep_for_readme(png, "private-report.png")


def test_show_on_a_failed_attempt_names_the_model_failure(tmp_path: Path, stub_image: str, real_codex: Path) -> None:  # noqa: F811
    job = tmp_path / "job"
    (job / "context").mkdir(parents=True)
    (job / "context" / "prompt.md").write_text(PROMPT)
    with ScriptedModel([turn(exec_call("echo first turn")), fault("http_500")]) as model:
        done = run_cli(*_execute(["--job-root", str(job), "--tag", TAG], model, tmp_path / "home", real_codex, stub_image),
                       env={KEY_VARIABLE: "sk-scripted-key"})
    assert done.returncode == 1
    shown = _show("--job-root", str(job))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == f"attempt {TAG}: runner_failed (failed_codex_codex_model_error)"
    assert _parsed_steps(shown.stdout)[0][1] == [("echo first turn", 0)]
    assert "codex: 1 turn(s) failed" in shown.stdout and "  codex error: " in shown.stdout
    assert "evaluation: not run" in shown.stdout
    atif = run_cli("export", "--format", "atif", "--job-root", str(job))
    assert atif.returncode == 0, atif.stderr
    document = json.loads(atif.stdout)
    validate_atif(document)
    assert document["extra"]["codex_errors"]  # the provider's failure, kept


def test_show_follow_prints_steps_as_they_happen_and_exits_when_the_attempt_ends(
    tmp_path: Path, stub_image: str, real_codex: Path  # noqa: F811
) -> None:
    job = tmp_path / "job"
    (job / "context").mkdir(parents=True)
    (job / "context" / "prompt.md").write_text(PROMPT)
    slow = [turn(fix_call(), thinking_seconds=1.5), *(turn(exec_call(f"echo step-{i}"), thinking_seconds=1.5)
                                                      for i in (2, 3)), turn(message("done"))]
    with ScriptedModel(slow) as model:
        argv = [sys.executable, "-m", "runner",
                *_execute(["--job-root", str(job), "--tag", TAG], model, tmp_path / "home", real_codex, stub_image)]
        run = subprocess.Popen(argv, cwd=REPO, env=cli_environment({KEY_VARIABLE: "sk-scripted-key"}),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while not (job / "logs" / "codex.stdout.log").exists():
                assert time.monotonic() < deadline and run.poll() is None, "codex never started"
                time.sleep(0.1)
            follow = subprocess.Popen([sys.executable, "-m", "runner", "show", "--follow", "--job-root", str(job),
                                       "--poll-seconds", "0.2"], cwd=REPO, env=cli_environment(None),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            seen: list[tuple[str, bool]] = []  # each line, and whether the run was still going when it came
            for line in follow.stdout:
                seen.append((line.rstrip("\n"), run.poll() is None))
            follow.wait(timeout=60)
            ended = run.wait(timeout=120)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
    assert ended == 0 and follow.returncode == 0, follow.stderr.read()
    texts = [text for text, _ in seen]
    assert texts[0] == f"attempt {TAG}: running"
    commands = [(text, live) for text, live in seen if text.startswith("  $ ")]
    assert [text.split("  -> ")[0] for text, _ in commands] == [f"  $ echo step-{i}" for i in (2, 3)]
    changes = [(text, live) for text, live in seen if text.startswith("  ~ update ")]
    assert [text for text, _ in changes] == ["  ~ update calc/mathops.py"]
    assert all(live for _, live in commands + changes), "a step was printed only after the attempt had ended"
    assert [t.split()[1] for t in texts if t.startswith("step ")] == ["1", "2", "3", "4"]
    assert [t for t in texts if t.startswith("  agent: ")] == ["  agent: done"]
    assert any(t.startswith("evaluation: apply exit 0") for t in texts)  # the summary, once it ended
    assert texts[-1].startswith("time: prepare")
