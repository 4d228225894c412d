"""``python -m runner evaluate`` against the official way of scoring a patch set, in one run.

    python bench/eval_bench.py                # 20 patches over 4 tags, 3 rounds
    python bench/eval_bench.py --rounds 5 --workers 4

The official way is the reference's ``eval_patches.py`` loop: one ``docker run --rm`` per patch
(the patch folder mounted, ``apply_patch && test_patched`` through the image's entrypoint), one
at a time. The runner scores the same patches with ``evaluate --workers N`` into a fresh jobs dir
each round (its interpreter start, discovery, plan, ledger and reduce included: the whole command).
Each round runs both, in alternating order; the figures are the medians, and the ratio is
runner / official (lower is better; issue 23's target is 0.4 at 4 workers). ``--workers 1`` is
measured too: the runner's own cost per patch against a bare ``docker run --rm``.

The stub's test takes a few milliseconds, so on it a patch costs what ``docker run`` costs (CPU in
the daemon), and workers share the host's cores. A task's real test waits (installs, a test suite,
a network): ``--test-seconds S`` derives an image whose ``test_patched`` first sleeps S seconds,
the share of a unit that parallel workers overlap.

Needs a Docker Engine and the stub image (``bash containers/build.sh`` builds
``agentissue-runner-stub:dev``). The verdicts of both ways are compared each round: a figure of a
run whose verdicts differ is refused.
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

from runner.settings import IMAGE_REPOSITORY  # noqa: E402

ENTRYPOINT = "/usr/local/bin/run_test_entrypoint.sh"
OFFICIAL_SUCCESS = ("PATCH SUCCEEDED", "PATCH SUCCESSFULLY VERIFIED", "FIX SUCCESSFULLY VERIFIED", "NO BUG",
                    "FIX CONFIRMED", "PATCH VERIFIED")


def _mathops(body: str, old: str = "    return a - b") -> str:
    return ("--- a/calc/mathops.py\n+++ b/calc/mathops.py\n@@ -1,6 +1,6 @@\n"
            ' """Basic arithmetic operations."""\n \n \n def add(a, b):\n'
            f'     """Return the sum of a and b."""\n-{old}\n+{body}\n')


def patch_set() -> dict[str, str]:
    """Five patches per tag, each one a container's work: golden, a fix, a wrong one, one that does not apply."""
    golden = (REPO / "containers" / "stub" / "golden.patch").read_text()
    return {"golden.patch": golden, "fix.patch": _mathops("    return a + b"),
            "wrong.patch": _mathops("    return a * b"), "noapply.patch": _mathops("    return a + b", "    return a / b"),
            "golden-again.patch": golden}


def official_serial(units: list[tuple[str, Path, str]]) -> dict[str, bool]:
    verdicts = {}
    for image, folder, name in units:
        done = subprocess.run(
            ["docker", "run", "--rm", "--network", "none", "-v", f"{folder}:/patches:ro", "--entrypoint", "bash",
             image, "-c", f"{ENTRYPOINT} apply_patch /patches/{name} && {ENTRYPOINT} test_patched"],
            capture_output=True, text=True, timeout=300)
        verdicts[f"{folder.name}/{name}"] = (done.returncode == 0 and "FAILED" not in done.stdout
                                             and any(s in done.stdout for s in OFFICIAL_SUCCESS))
    return verdicts


def runner_evaluate(patches: Path, jobs: Path, workers: int) -> dict[str, bool]:
    shutil.rmtree(jobs, ignore_errors=True)
    done = subprocess.run(
        [sys.executable, "-m", "runner", "evaluate", "--patches-dir", str(patches), "--jobs-dir", str(jobs),
         "--workers", str(workers), "--eval-network", "none", "--format", "json"],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"evaluate exited {done.returncode}: {done.stderr[-2000:]}")
    ledger = json.loads((jobs / "eval-ledger.json").read_text())
    return {f"{row['tag']}/{row['patch']}": bool(row["resolved"]) for row in ledger["rows"]}


def slow_test_image(client, image: str, seconds: float):
    """The image with ``sleep SECONDS`` as the first line of its test_patched case."""
    dockerfile = (f"FROM {image}\n"
                  f"RUN sed -i 's/^    test_patched)$/    test_patched)\\n        sleep {seconds:g}/' {ENTRYPOINT} "
                  f"&& grep -q 'sleep {seconds:g}' {ENTRYPOINT}\n")
    with tempfile.TemporaryDirectory() as context:
        (Path(context) / "Dockerfile").write_text(dockerfile)
        built, _ = client.images.build(path=context, tag=f"agentissue-runner-stub:evalbench-sleep", rm=True)
    return built


def timed(fn):
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default="agentissue-runner-stub:dev")
    parser.add_argument("--tags", type=int, default=4)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--test-seconds", type=float, default=0.0,
                        help="derive an image whose test_patched sleeps this long first (0: the stub as it is)")
    parser.add_argument("--output", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    import docker

    client = docker.from_env()
    base = client.images.get(args.image)
    if args.test_seconds > 0:
        base = slow_test_image(client, args.image, args.test_seconds)
    tags = [f"evalbench_{i}" for i in range(1, args.tags + 1)]
    for tag in tags:
        base.tag(IMAGE_REPOSITORY, tag)
    scratch = Path(tempfile.mkdtemp(prefix="eval-bench-"))
    try:
        patches = scratch / "Patches"
        units = []
        for tag in tags:
            folder = patches / tag
            folder.mkdir(parents=True)
            for name, text in patch_set().items():
                (folder / name).write_text(text)
                units.append((f"{IMAGE_REPOSITORY}:{tag}", folder, name))
        figures: dict[str, list[float]] = {"official_serial": [], "runner_workers": [], "runner_workers_1": []}
        for round_no in range(args.rounds):
            ways = [("official_serial", lambda: official_serial(units)),
                    ("runner_workers", lambda: runner_evaluate(patches, scratch / "jobs-n", args.workers)),
                    ("runner_workers_1", lambda: runner_evaluate(patches, scratch / "jobs-1", 1))]
            if round_no % 2:
                ways.reverse()
            verdicts = {}
            for name, way in ways:
                seconds, verdicts[name] = timed(way)
                figures[name].append(seconds)
                print(f"round {round_no + 1}: {name:<18} {seconds:7.2f} s", flush=True)
            if not (verdicts["official_serial"] == verdicts["runner_workers"] == verdicts["runner_workers_1"]):
                raise SystemExit(f"the verdicts differ: {verdicts}")
        medians = {name: statistics.median(values) for name, values in figures.items()}
        result = {
            "patches": len(units), "tags": len(tags), "workers": args.workers, "rounds": args.rounds,
            "cpus": os.cpu_count(), "test_seconds": args.test_seconds, "median_seconds": {k: round(v, 3) for k, v in medians.items()},
            "ratio_workers_vs_official": round(medians["runner_workers"] / medians["official_serial"], 3),
            "ratio_workers_1_vs_official": round(medians["runner_workers_1"] / medians["official_serial"], 3),
            "resolved": sum(verdicts["official_serial"].values()),
        }
        print(json.dumps(result, indent=2))
        if args.output:
            args.output.write_text(json.dumps(result, indent=2) + "\n")
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        for tag in tags:
            try:
                client.images.remove(f"{IMAGE_REPOSITORY}:{tag}", noprune=True)
            except docker.errors.APIError:
                pass


if __name__ == "__main__":
    raise SystemExit(main())
