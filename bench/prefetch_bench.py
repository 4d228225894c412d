"""A suite's makespan on one worker with image prefetch against without, measured in one run.

    python bench/prefetch_bench.py                      # 4 tags of 300 MB images, codex 8 s each
    python bench/prefetch_bench.py --tags 3 --mb 100 --codex-seconds 4 --repeat 1

Each tag is a synthetic variant of the stub image with its own bulk layer, pushed to a
registry on loopback (Debian's docker-registry; none present locally at the start of a
round). One worker (one slot, the fake codex sleeping ``--codex-seconds`` per task as a real
codex would think) runs the suite once with ``--prefetch 0`` and once with ``--prefetch 2``,
in alternating order per round; the makespan is from the worker's start to the last task done.
Prints each round, the medians, and the ratio with prefetch / without (lower is better).
Needs a Docker Engine, redis-server and docker-registry on PATH, and the base image
runner-base:bookworm (STUB_BASE_IMAGE).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import docker  # noqa: E402
import redis  # noqa: E402

from runner.fleet.broker import Keys  # noqa: E402
from runner.fleet.ledger import SuiteLedger  # noqa: E402
from tests.ports import free_port  # noqa: E402
from tests.registry_support import Registry, push_variant, remove_local  # noqa: E402

FAKE_CODEX = REPO / "tests" / "fake_codex" / "codex"
STUB_IMAGE = "agentissue-runner-stub:bench"


def _runner(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          check=False)


def _round(prefetch: int, tags: list[str], *, scratch: Path, registry: Registry, client, url: str, env: dict[str, str],
           number: int) -> float:
    suite, namespace = f"bench-{number}-p{prefetch}", f"prefetch-bench-{number}-{prefetch}"
    remove_local(client, registry.repository())
    submitted = _runner("submit", "--broker", url, "--namespace", namespace, "--suite", suite, "--prompts-dir",
                        str(scratch / "prompts"), "--image-repository", registry.repository(), "--eval-network", "none",
                        *[a for tag in tags for a in ("--tag", tag)], env=env)
    if submitted.returncode != 0:
        raise SystemExit(f"submit failed: {submitted.stderr[-2000:]}")
    jobs = scratch / f"jobs-{number}-{prefetch}"
    started = time.monotonic()
    worker = subprocess.Popen(
        [sys.executable, "-m", "runner", "worker", "--broker", url, "--namespace", namespace, "--jobs-dir", str(jobs),
         "--codex-bin", str(FAKE_CODEX), "--allow-pull", "--prefetch", str(prefetch), "--check-interval", "1",
         "--state-dir", str(scratch / f"state-{number}-{prefetch}"), "--name", f"bench-{prefetch}"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=open(scratch / f"worker-{number}-{prefetch}.log", "w"))
    ledger = SuiteLedger(redis.Redis.from_url(url), Keys(namespace), suite)
    try:
        while True:
            rows = ledger.rows()
            if len(rows) == len(tags) and all(row.state.value in ("done", "failed") for row in rows):
                break
            if worker.poll() is not None:
                raise SystemExit(f"the worker died: {(scratch / f'worker-{number}-{prefetch}.log').read_text()[-2000:]}")
            time.sleep(0.1)
        makespan = time.monotonic() - started
        if not all(row.resolved for row in rows):
            raise SystemExit(f"a task did not resolve: {[(r.tag, r.failure_label) for r in rows]}")
    finally:
        worker.terminate()
        worker.wait(60)
    return makespan


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tags", type=int, default=4)
    parser.add_argument("--mb", type=int, default=300, help="each image's own bulk layer")
    parser.add_argument("--codex-seconds", type=float, default=8.0)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "results" / "prefetch.json")
    args = parser.parse_args()

    client = docker.from_env()
    base = os.environ.get("STUB_BASE_IMAGE", "runner-base:bookworm")
    client.images.build(path=str(REPO / "containers" / "stub"), tag=STUB_IMAGE, buildargs={"BASE_IMAGE": base},
                        rm=True, pull=False)
    scratch = Path(tempfile.mkdtemp(prefix="prefetch-bench-"))
    port = free_port()
    redis_server = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                                     "--appendonly", "no"], stdout=subprocess.DEVNULL)
    (scratch / "registry").mkdir()
    registry = Registry(scratch / "registry")
    env = {**os.environ, "CODEX_HOME": str(scratch / "codex-home")}
    (scratch / "codex-home").mkdir()
    (scratch / "codex-home" / "auth.json").write_text("{}\n")
    try:
        registry.start()
        tags = [f"t_bench_{i}" for i in range(1, args.tags + 1)]
        pushed = time.monotonic()
        for tag in tags:
            push_variant(client, registry, STUB_IMAGE, tag, args.mb)
            prompt = scratch / "prompts" / tag / "context" / "prompt.md"
            prompt.parent.mkdir(parents=True)
            prompt.write_text(f"Fix calc.add.\nfake-codex-sleep: {args.codex_seconds}\nfake-codex-mode: fix\n")
        print(f"pushed {args.tags} images of {args.mb} MB in {time.monotonic() - pushed:.1f} s", flush=True)
        url = f"redis://127.0.0.1:{port}/0"
        times: dict[int, list[float]] = {0: [], 2: []}
        for number in range(args.repeat):
            for prefetch in ((0, 2) if number % 2 == 0 else (2, 0)):
                makespan = _round(prefetch, tags, scratch=scratch, registry=registry, client=client, url=url, env=env,
                                  number=number)
                times[prefetch].append(makespan)
                print(f"round {number + 1}: --prefetch {prefetch}: makespan {makespan:.1f} s", flush=True)
        without, with_prefetch = statistics.median(times[0]), statistics.median(times[2])
        figures = {"tags": args.tags, "image_mb": args.mb, "codex_seconds": args.codex_seconds, "rounds": args.repeat,
                   "makespan_without_s": round(without, 2), "makespan_with_prefetch_s": round(with_prefetch, 2),
                   "ratio_with_over_without": round(with_prefetch / without, 3),
                   "saved_s": round(without - with_prefetch, 2)}
        print(json.dumps(figures, indent=2))
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(figures, indent=2) + "\n")
    finally:
        remove_local(client, registry.repository())
        registry.stop()
        redis_server.terminate()
        redis_server.wait(10)
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
