"""Images at suite scale, against a real registry on loopback (Debian's docker-registry) and real engines.

Six tags, each a synthetic variant of the stub image with its own bulk layer (about 300 MB,
``RUNNER_TEST_VARIANT_MB``), pushed to the registry and absent locally at the start: a batch
and a fleet of two workers, each worker on a Docker Engine of its own (two hosts), pull them
(pinned by digest), evict what the runner pulled under ``--image-budget-gb``, and score every
task once. Every image a test pulled or pushed is removed at its registry's teardown, which
fails if one stays.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.images import PulledImages, gigabytes
from tests.conftest import FAKE_CODEX, log_events, read_json, run_cli
from tests.engine_support import Engine
from tests.fleet_support import Fleet
from tests.registry_support import (Registry, assert_none_left, local_images, push_variant, remove_local,
                                    start_registry)

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]

VARIANT_MB = int(os.environ.get("RUNNER_TEST_VARIANT_MB", "300"))
BUDGET_GB = round(VARIANT_MB / 300, 3)  # 1 GB for 300 MB variants: three fit, never a fourth
FIT = int(BUDGET_GB * 1024 // VARIANT_MB)
TAGS = [f"t_img_{i}" for i in range(1, 7)]
FIX = "Fix calc.add.\nfake-codex-mode: fix\n"


@pytest.fixture(scope="module")
def suite_registry(docker_client, stub_image: str, tmp_path_factory) -> Iterator[tuple[Registry, dict[str, str]]]:
    registry = start_registry(tmp_path_factory.mktemp("suite-registry"))
    try:
        digests = {tag: push_variant(docker_client, registry, stub_image, tag, VARIANT_MB) for tag in TAGS}
        yield registry, digests
    finally:
        registry.stop()
        assert_none_left(docker_client, registry)


class ImageSampler:
    """What one engine holds of the suite's (large) images, sampled every 0.2 s while the suite runs
    (the SDK's image list): the most images and the most bytes seen at once, and the largest image.

    An image's bytes are its size less the stub's, which every variant is built on: the bulk the
    budget is about (the stub's layers, shared by all, are never what eviction frees). ``digests``:
    only the suite's large images are counted by ``most``; ``most_bytes`` counts every image of
    ``repository`` (everything the runner pulled from the registry).
    """

    def __init__(self, docker_client, repository: str, digests: set[str], base_bytes: int = 0) -> None:
        self._client, self._repository, self._digests, self._base = docker_client, repository, digests, base_bytes
        self.most = self.most_bytes = self.largest = self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def figures(self) -> dict[str, int]:
        return {"most": self.most, "most_bytes": self.most_bytes, "largest": self.largest, "samples": self.samples}

    def sample(self) -> None:
        images = local_images(self._client, self._repository)
        sizes = [max(int(image.attrs.get("Size") or 0) - self._base, 0) for image in images]
        held = sum(1 for image in images
                   if any(entry.rpartition("@")[2] in self._digests for entry in image.attrs.get("RepoDigests") or []))
        self.most, self.most_bytes = max(self.most, held), max(self.most_bytes, sum(sizes))
        self.largest = max([self.largest, *sizes])
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:
                pass  # an image removed while listed: the next sample sees the rest
            self._stop.wait(0.2)

    def __enter__(self) -> ImageSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def _prompts(jobs: Path, tags: list[str]) -> None:
    for tag in tags:
        (jobs / tag / "context").mkdir(parents=True, exist_ok=True)
        (jobs / tag / "context" / "prompt.md").write_text(FIX)


def _stub_bytes(docker_client, stub_image: str) -> int:
    return int(docker_client.images.get(stub_image).attrs["Size"])


def test_a_batch_pulls_pinned_images_and_keeps_its_own_under_the_budget(
    tmp_path: Path, docker_client, stub_image: str, suite_registry: tuple[Registry, dict[str, str]]
) -> None:
    registry, digests = suite_registry
    repository = registry.repository()
    remove_local(docker_client, repository)
    jobs, state = tmp_path / "jobs", tmp_path / "state"
    _prompts(jobs, TAGS)
    with ImageSampler(docker_client, repository, set(digests.values()), _stub_bytes(docker_client, stub_image)) as sampler:
        done = run_cli("--execute", "--jobs-dir", str(jobs), *[a for t in TAGS for a in ("--tag", t)],
                       "--image-repository", repository, "--allow-pull", f"--image-budget-gb={BUDGET_GB}",
                       "--codex-bin", str(FAKE_CODEX), "--state-dir", str(state), "--eval-network", "none",
                       timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["ran"] == 6 and summary["states"] == {"done": 6} and summary["resolved"] == 6
    for tag in TAGS:  # each scored once, on the image pushed for it (name and digest both recorded)
        run = read_json(jobs / tag / "benchmark_run.compact.json")
        assert run["selected_image"] == f"{repository}:{tag}"
        assert run["image_digest"] == f"{repository}@{digests[tag]}", tag
    assert sampler.most <= FIT + 1, f"{sampler.most} of the suite's images at once; the budget fits {FIT}"
    assert sampler.largest > 0 and sampler.most_bytes <= gigabytes(BUDGET_GB) + sampler.largest, sampler.figures
    assert len(local_images(docker_client, repository)) <= FIT
    task_logs = "".join(path.read_text() for path in (jobs / ".batch-logs").iterdir())
    assert "image_pull_progress" in task_logs and "image_pinned" in done.stderr
    assert str(tmp_path) not in json.dumps(summary)
    # the report names each task's image by the digest pushed for its tag
    assert run_cli("report", "--jobs-dir", str(jobs), "--out", str(tmp_path / "r.md"), "--format", "markdown",
                   ).returncode == 0
    shown = (tmp_path / "r.md").read_text()
    assert all(f"| {tag} #1 | codex | {digests[tag]} |" in shown for tag in TAGS), shown
    assert registry.host not in shown  # the digest alone, not the registry's address

    listed = run_cli("--images", "list", "--state-dir", str(state))
    assert listed.returncode == 0, listed.stderr
    report = json.loads(listed.stdout)
    assert 1 <= report["count"] <= FIT and {i["digest"] for i in report["images"]} <= set(digests.values())
    assert report["images"][0]["name"].startswith(repository + "@sha256:")
    assert str(tmp_path) not in listed.stdout
    pruned = json.loads(run_cli("--images", "prune", "--state-dir", str(state)).stdout)
    assert pruned["count"] == 0 and len(pruned["removed"]) == report["count"]
    assert local_images(docker_client, repository) == []
    # the rerun skips every scored task: nothing pulled again
    again = run_cli("--execute", "--jobs-dir", str(jobs), *[a for t in TAGS for a in ("--tag", t)],
                    "--image-repository", repository, "--allow-pull", "--codex-bin", str(FAKE_CODEX),
                    "--state-dir", str(state))
    assert again.returncode == 0 and json.loads(again.stdout)["skipped_completed"] == 6
    assert local_images(docker_client, repository) == []


def test_an_image_that_was_here_before_is_never_evicted(
    tmp_path: Path, docker_client, stub_image: str
) -> None:
    """A local image (built here, not pulled) is pinned by id, used, and never removed by the budget."""
    jobs, state = tmp_path / "jobs", tmp_path / "state"
    _prompts(jobs, ["t_local_1", "t_local_2"])
    done = run_cli("--execute", "--jobs-dir", str(jobs), "--tag", "t_local_1", "--tag", "t_local_2",
                   "--image", stub_image, "--image-budget-gb=0.001", "--codex-bin", str(FAKE_CODEX),
                   "--state-dir", str(state), "--eval-network", "none")
    assert done.returncode == 0, done.stderr[-3000:]
    stub_id = docker_client.images.get(stub_image).id
    assert f"ref={stub_id}" in done.stderr or stub_id in done.stderr  # pinned by its id
    assert docker_client.images.get(stub_image).id == stub_id
    assert PulledImages(state).entries() == []


def test_the_fleet_evaluates_the_digest_pinned_at_submit_and_survives_a_registry_outage(
    fleet: Fleet, docker_client, stub_image: str, suite_registry: tuple[Registry, dict[str, str]],
    second_engine: Engine, tmp_path: Path
) -> None:
    """Two hosts: each worker on an engine of its own (host-a on the tests' engine, host-b on a second
    dockerd), each under ``--image-budget-gb``, sampled apart: a host's budget is its own engine's."""
    registry, digests = suite_registry
    repository = registry.repository()
    remove_local(docker_client, repository)
    engines = {"host-a": docker_client, "host-b": second_engine.client}
    environments = {"host-a": {}, "host-b": {"DOCKER_HOST": second_engine.host}}
    assert local_images(second_engine.client, repository) == []  # none present at the start, on either host
    for tag in TAGS:
        fleet.prompt(tag, FIX)
    # one tag is re-pushed between submit and evaluation: the pinned digest is what is scored
    moved = "t_img_moved"
    fleet.prompt(moved, FIX)
    first = push_variant(docker_client, registry, stub_image, moved, 5)
    submitted = run_cli("submit", "--broker", fleet.url, "--namespace", fleet.namespace, "--suite", "imgs",
                        "--prompts-dir", str(fleet.prompts), "--image-repository", repository,
                        "--eval-network", "none", *[a for t in [*TAGS, moved] for a in ("--tag", t)])
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    second = push_variant(docker_client, registry, stub_image, moved, 5)
    assert second != first
    registry.stop()  # down at pull time: an infrastructure failure, retried until it is back
    workers = {name: fleet.worker(name, fleet.jobs(name), "--allow-pull", f"--image-budget-gb={BUDGET_GB}",
                                  "--state-dir", str(tmp_path / f"state-{name}"), "--retry-backoff", "1",
                                  "--max-infra-retries", "8", env=environments[name])
               for name in engines}
    fleet.wait("a pull failed and is retried",
               lambda: any(row["retries"] >= 1 for row in fleet.rows("imgs").values()), timeout=120)
    base = _stub_bytes(docker_client, stub_image)
    samplers = {name: ImageSampler(client, repository, set(digests.values()), base) for name, client in engines.items()}
    registry.start()
    with samplers["host-a"], samplers["host-b"]:
        fleet.wait("every task done", lambda: len(fleet.rows("imgs")) == 7 and
                   all(row["state"] == "done" for row in fleet.rows("imgs").values()), timeout=600)
    rows = fleet.rows("imgs")
    assert all(row["resolved"] for row in rows.values())
    scored = {key: (row["image_digest"] or "").rpartition("@")[2] for key, row in rows.items()}
    assert scored[f"{moved}/1"] == first != second  # the submit's pin, not the later push
    assert all(scored[f"{tag}/1"] == digests[tag] for tag in TAGS)
    assert any(row["retries"] >= 1 for row in rows.values()), "the outage was retried, not scored"
    # the suite report names each task's image by the digest pinned for it (the moved tag's: the first push)
    shown = run_cli("report", "--suite", "imgs", "--broker", fleet.url, "--namespace", fleet.namespace,
                    "--out", str(tmp_path / "imgs.md"), "--format", "markdown")
    assert shown.returncode == 0, shown.stderr[-2000:]
    report = (tmp_path / "imgs.md").read_text()
    assert all(f"| {tag} #1 | codex | {digests[tag]} |" in report for tag in TAGS), report
    assert f"| {moved} #1 | codex | {first} |" in report and second not in report
    stderr = {}
    for name, worker in workers.items():
        code, _out, stderr[name] = fleet.stop(worker)
        assert code == 0, stderr[name][-2000:]
    # each task ended done exactly once, on one host or the other (the outage's failures were retries)
    finished = [(event["task"], name) for name in workers for event in log_events(stderr[name], "task_finished")
                if event.get("state") == "done" and event.get("suite") == "imgs"]
    assert sorted(task for task, _ in finished) == sorted(rows), finished
    budget = gigabytes(BUDGET_GB)
    for name, sampler in samplers.items():  # each host's own engine: its budget plus the one it pulls
        assert sampler.samples > 10 and sampler.largest > 0, (name, sampler.figures)
        assert sampler.most <= FIT + 1, (name, sampler.figures)
        assert sampler.most_bytes <= budget + sampler.largest, (name, sampler.figures)
        kept = PulledImages(tmp_path / f"state-{name}").entries()
        assert len([e for e in kept if e.digest in set(digests.values())]) <= FIT, (name, kept)
        held = {image.id for image in local_images(engines[name], repository)}
        assert held <= {e.image_id for e in kept}, f"{name} holds a suite image its runner does not track"
    assert {host for _, host in finished} == set(workers), f"one host did every task: {finished}"


def test_a_wrong_image_name_fails_at_once_and_is_not_retried(
    fleet: Fleet, registry: Registry, tmp_path: Path
) -> None:
    fleet.prompt("t_nowhere", FIX)
    submitted = run_cli("submit", "--broker", fleet.url, "--namespace", fleet.namespace, "--suite", "wrong",
                        "--prompts-dir", str(fleet.prompts), "--image-repository", registry.repository("no-such-repo"),
                        "--tag", "t_nowhere")
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    assert "image_not_pinned" in submitted.stderr
    worker = fleet.worker("host-w", fleet.jobs("host-w"), "--allow-pull", "--retry-backoff", "1",
                          "--state-dir", str(tmp_path / "state"))
    row = fleet.wait_state("wrong", "t_nowhere/1", "failed", timeout=120)
    assert row["retries"] == 0 and row["infra_failure"] is False
    assert "image_unknown" in (row["failure_label"] or ""), row
    started = time.monotonic()
    fleet.stop(worker)
    assert time.monotonic() - started < 60


def test_a_worker_prefetches_the_next_messages_images_while_a_task_runs(
    fleet: Fleet, docker_client, stub_image: str, registry: Registry, tmp_path: Path
) -> None:
    tags = ["t_pre_1", "t_pre_2", "t_pre_3"]
    for tag in tags:
        push_variant(docker_client, registry, stub_image, tag, 5)
        fleet.prompt(tag, "Fix calc.add.\nfake-codex-sleep: 4\nfake-codex-mode: fix\n")
    submitted = run_cli("submit", "--broker", fleet.url, "--namespace", fleet.namespace, "--suite", "pre",
                        "--prompts-dir", str(fleet.prompts), "--image-repository", registry.repository(),
                        "--eval-network", "none", *[a for t in tags for a in ("--tag", t)])
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    jobs = fleet.jobs("host-p")
    worker = fleet.worker("host-p", jobs, "--allow-pull", "--prefetch", "2", "--state-dir", str(tmp_path / "state"))
    fleet.wait("all done", lambda: len(fleet.rows("pre")) == 3 and
               all(row["state"] == "done" for row in fleet.rows("pre").values()), timeout=300)
    code, _out, stderr = fleet.stop(worker)
    assert code == 0, stderr[-2000:]
    assert len(log_events(stderr, "image_prefetched")) >= 2, stderr[-3000:]  # pulled during the 1st task
    logs = {path.name: path.read_text() for path in (jobs / "pre" / ".worker-logs").iterdir()}
    later = [text for name, text in logs.items() if name.startswith(("t_pre_2.", "t_pre_3."))]
    assert later and all("image_pull_started" not in text for text in later), "a later task waited for its pull"
    assert {entry.name.rsplit("@", 1)[0] for entry in PulledImages(tmp_path / "state").entries()} == {registry.repository()}


def test_a_pinned_digest_the_registry_no_longer_serves_fails_as_infrastructure_naming_it(
    tmp_path: Path, docker_client, stub_image: str, registry: Registry
) -> None:
    import urllib.request

    from reducers.outcome import TaskState, task_facts
    from runner.jobroot import written_run
    from tests.conftest import make_job_root

    digest = push_variant(docker_client, registry, stub_image, "t_gone", 5)
    request = urllib.request.Request(f"http://{registry.host}/v2/agentissue-bench/manifests/{digest}", method="DELETE")
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 202
    job = make_job_root(tmp_path)
    pinned = f"{registry.repository()}@{digest}"
    done = run_cli("--execute", "--job-root", str(job), "--tag", "t_gone", "--image", pinned, "--allow-pull",
                   "--codex-bin", str(FAKE_CODEX))
    assert done.returncode == 3, done.stderr[-2000:]  # the host's or the registry's: a fleet retries it
    assert f"{pinned} failed: the pinned digest is no longer served" in done.stderr
    report = json.loads(done.stdout)
    assert report["failure_label"] == "failed_precheck_precheck_image_present"
    facts = task_facts(written_run(job), 3, 1.0)
    assert facts.infra_failure is True and facts.state is TaskState.FAILED


def test_a_registry_s_words_reach_public_output_bounded_and_without_paths_or_credentials() -> None:
    from runner.images import public_registry_message

    said = ("Get \"https://user:hunter2@registry.example/v2/\": open /var/lib/docker/tmp/x: no space left\n" + "x" * 500)
    shown = public_registry_message(said)
    assert "hunter2" not in shown and "/var/lib/docker" not in shown and "\n" not in shown
    assert len(shown) <= 240 and "registry.example/v2/" in shown


def test_a_pull_that_stalls_past_pull_timeout_fails_as_infrastructure(
    tmp_path: Path, docker_client, stub_image: str, registry: Registry
) -> None:
    """The registry answers, then its blobs never come: the pull says nothing, and ends at --pull-timeout."""
    from tests.conftest import make_job_root
    from tests.registry_support import StallingRegistry

    push_variant(docker_client, registry, stub_image, "t_stall", 5)
    front = StallingRegistry(registry)
    try:
        job = make_job_root(tmp_path)
        started = time.monotonic()
        done = run_cli("--execute", "--job-root", str(job), "--tag", "t_stall", "--image",
                       f"{front.host}/agentissue-bench:t_stall", "--allow-pull", "--pull-timeout", "3",
                       "--codex-bin", str(FAKE_CODEX), timeout=120)
        took = time.monotonic() - started
    finally:
        front.close()
    assert done.returncode == 3, done.stderr[-2000:]
    assert "no progress for 3 s (--pull-timeout)" in done.stderr, done.stderr[-2000:]
    assert took < 60, took
    assert json.loads(done.stdout)["failure_label"] == "failed_precheck_precheck_image_present"


def test_a_prefetch_gets_room_only_by_evicting_what_no_task_here_needs(
    tmp_path: Path, docker_client, stub_image: str, registry: Registry
) -> None:
    """``room_for_one`` (a prefetch's question): with one pulled image that a task here still needs and a
    budget too small for it and one more, no room and nothing removed; once no task needs it, it goes."""
    from runner.images import ensure_image

    push_variant(docker_client, registry, stub_image, "t_room", 20)
    name = f"{registry.repository()}:t_room"
    pulled = ensure_image(docker_client, name, allow_pull=True, pull_timeout=120, state_dir=tmp_path)
    record = PulledImages(tmp_path)
    assert [e.image_id for e in record.entries()] == [pulled.id]
    budget = 25 * 1024 * 1024  # room for one 20 MB image, never two
    assert record.room_for_one(docker_client, budget, keep={name}) is False
    assert docker_client.images.get(pulled.id).id == pulled.id and len(record.entries()) == 1
    assert record.room_for_one(docker_client, budget) is True
    assert local_images(docker_client, registry.repository()) == [] and record.entries() == []
