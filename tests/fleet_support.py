"""The fleet in a test: workers as real processes on a real Redis, the stub image, the fake codex."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from runner.fleet.broker import Keys
from runner.fleet.ledger import SuiteLedger
from tests.conftest import FAKE_CODEX, RunningCli, run_cli


class Fleet:
    def __init__(self, url: str, namespace: str, tmp_path: Path, image: str) -> None:
        self.url, self.namespace, self.tmp, self.image = url, namespace, tmp_path, image
        self.codex_home = tmp_path / "codex-home"
        self.codex_home.mkdir()
        (self.codex_home / "auth.json").write_text("{}\n")  # a login for the host check; fake codex needs none
        self.prompts = tmp_path / "prompts"
        self.client = redis.Redis.from_url(url)
        self.workers: list[RunningCli] = []

    def jobs(self, name: str) -> Path:
        path = self.tmp / name
        path.mkdir(exist_ok=True)
        return path

    def prompt(self, tag: str, text: str) -> None:
        (self.prompts / tag / "context").mkdir(parents=True, exist_ok=True)
        (self.prompts / tag / "context" / "prompt.md").write_text(text)

    def worker(self, name: str, jobs: Path, *args: str, env: dict[str, str] | None = None) -> RunningCli:
        worker = RunningCli(
            "worker", "--broker", self.url, "--namespace", self.namespace, "--jobs-dir", str(jobs),
            "--codex-bin", str(FAKE_CODEX), "--name", name, "--check-interval", "1", "--heartbeat-timeout", "3",
            *args, env={"CODEX_HOME": str(self.codex_home), **(env or {})},
        )
        self.workers.append(worker)
        worker.wait_for("worker_started", timeout=60)
        return worker

    def submit(self, suite: str, *args: str, image: str | None = None) -> Any:
        return run_cli("submit", "--broker", self.url, "--namespace", self.namespace, "--suite", suite,
                       "--prompts-dir", str(self.prompts), "--image", image or self.image, *args)

    def status(self, *args: str) -> Any:
        return run_cli("status", "--broker", self.url, "--namespace", self.namespace, *args)

    def rows(self, suite: str) -> dict[str, dict[str, Any]]:
        ledger = SuiteLedger(self.client, Keys(self.namespace), suite)
        return {row.key: row.model_dump(mode="json") for row in ledger.rows()}

    def wait(self, what: str, condition: Callable[[], bool], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            for worker in self.workers:
                if worker.process.poll() is not None and worker.process.returncode not in (0, -9):
                    raise AssertionError(f"a worker died ({worker.process.returncode}): {''.join(worker.lines)[-3000:]}")
            time.sleep(0.2)
        logs = "\n".join("".join(w.lines)[-2500:] for w in self.workers)
        raise AssertionError(f"timed out waiting for {what}; workers' logs:\n{logs}")

    def wait_state(self, suite: str, key: str, state: str, *, phase: str | None = None, timeout: float = 120) -> dict:
        def reached() -> bool:
            row = self.rows(suite).get(key)
            return row is not None and row["state"] == state and (phase is None or row["phase"] == phase)

        self.wait(f"{suite}/{key} {state} {phase or ''}", reached, timeout)
        return self.rows(suite)[key]

    def stop(self, worker: RunningCli, *, signals: int = 1) -> tuple[int, str, str]:
        for _ in range(signals):
            worker.process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
        return worker.finish(timeout=120)


@pytest.fixture
def fleet(redis_namespace: tuple[str, str], tmp_path: Path, stub_image: str) -> Iterator[Fleet]:
    url, namespace = redis_namespace
    fleet = Fleet(url, namespace, tmp_path, stub_image)
    yield fleet
    for worker in fleet.workers:  # a failed test must not leave a daemon behind
        if worker.process.poll() is None:
            worker.process.kill()
            worker.process.wait(timeout=30)
    time.sleep(1)  # the killed workers' children end through their own cleanup (parent-death signal)
    fleet.client.close()
