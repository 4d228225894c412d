"""The runner's benchmark: its own overhead against the reference's CLI way, measured in one run.

    python bench/run_bench.py                 # 1,000 / 20,000 / 100,000-file trees (about 1 GB)
    python bench/run_bench.py --quick         # 1,000 / 20,000 only, fewer repeats

Prints each figure and each ratio (runner / CLI baseline, lower is better) and writes them as
JSON (``--output``). Needs a Docker Engine and the stub image's base (see containers/README.md).
Trees are written under ``--scratch`` (tmpfs by default, so disk noise does not decide a ratio).
Runner timings are taken inside a child process around the phase calls (its interpreter start
and imports are reported apart, once per run, not per phase); CLI timings are wall times of the
commands. Each extract figure is the best of ``--repeat`` runs (at least 7 for the 1,000-file
tree, where one noisy run moves the ratio), alternating which way goes first. Evaluate is the
median of 30 rounds (15 with ``--quick``), each running the runner's evaluate phase, the
reference script's own ``docker run --rm`` and a bare ``docker run --rm`` once, in rotating
order.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
STUB_IMAGE = "agentissue-runner-stub:bench"
FAKE_CODEX = REPO / "tests" / "fake_codex" / "codex"
# What the batches run as codex: the fake, started by this interpreter itself. Its shebang
# (``/usr/bin/env python3``) would go through whatever python3 is first on PATH: on a host with
# pyenv's shims that alone is a dozen bash processes and about 0.1 s a start, which is neither
# the runner's cost nor an agent's. Set in ``main`` (a wrapper in the scratch directory).
CODEX_BIN = FAKE_CODEX


def direct_fake_codex(scratch: Path) -> Path:
    wrapper = scratch / "fake-codex"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_CODEX} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper
# files -> MB of binary blobs; text files average 4 KiB, so the largest tree is about 1 GB.
TREES = {1000: 4, 20000: 50, 100000: 600}
GIT_ENV = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def sh(*argv: str, cwd: Path | None = None, stdout=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=GIT_ENV, check=True, stdout=stdout, stderr=subprocess.PIPE)


def remove_tree(path: Path) -> None:
    """rm -rf, and say so if it failed: a leftover tree would skew the next measurement."""
    subprocess.run(["rm", "-rf", str(path)], check=True)
    if path.exists():
        raise SystemExit(f"could not remove {path}")


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


# --- the child: the runner's own phases, in-process ------------------------------------------

def child(mode: str, args: list[str]) -> None:
    """Run the runner's phases and print one JSON line of figures."""
    started_import = time.perf_counter()
    from runner.context import JobContext
    from runner.jobroot import JobRoot
    from runner.logs import configure_logging
    from runner.tasks.spec import load_settings

    configure_logging(json_lines=True, level=40)
    import_seconds = time.perf_counter() - started_import
    if mode == "extract":
        from runner.phases.baseline import baseline
        from runner.phases.extract import extract

        image, root, cache = args
        # "-": the cache off (the extraction as it always was); else the cache in that directory.
        caching = {"cache_max_gb": 0} if cache == "-" else {"cache_max_gb": 100, "cache_dir": cache}
        ctx = JobContext(settings=load_settings(tag="bench", image=image, **caching), job=JobRoot.at(Path(root), "bench"))
        ctx.job.root.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        result = extract(ctx)
        t1 = time.perf_counter()
        baseline(ctx)
        t2 = time.perf_counter()
        ctx.close()
        figures = {"extract_seconds": t1 - t0, "baseline_seconds": t2 - t1, "seconds": t2 - t0,
                   "files": result.file_count, "bytes": result.byte_count, "from_cache": result.from_cache}
    elif mode == "patch":
        from runner.errors import PhaseError
        from runner.phases.patch import export_patch

        root, commit = args
        ctx = JobContext(settings=load_settings(tag="bench"), job=JobRoot.at(Path(root), "bench"))
        t0 = time.perf_counter()
        try:
            changed = export_patch(ctx, commit).changed_file_count
        except PhaseError as e:  # an unchanged tree: the phase's answer is empty_patch, found as fast
            if e.reason != "empty_patch":
                raise
            changed = 0
        figures = {"seconds": time.perf_counter() - t0, "changed_files": changed}
    elif mode == "evaluate":
        from runner.phases.evaluate import evaluate

        image, root, repeat, patch_dir, marker_dir = args[0], args[1], int(args[2]), Path(args[3]), Path(args[4])
        network = args[5]
        settings = load_settings(tag="bench", image=image, apply_cmd="true", test_cmd="true", eval_network=network)
        ctx = JobContext(settings=settings, job=JobRoot.at(Path(root), "bench"))
        ctx.job.patch.parent.mkdir(parents=True, exist_ok=True)
        ctx.job.patch.write_text("--- a/x\n+++ b/x\n")
        image_id = ctx.docker().images.get(image).id
        ways = {
            "runner": lambda: evaluate(ctx, image_id),
            "reference": lambda: sh(*reference_eval_argv(patch_dir, marker_dir, network)),
            "bare": lambda: sh(*bare_run_argv(patch_dir, network)),
        }
        runs: dict[str, list[float]] = {way: [] for way in ways}
        order = list(ways)
        for _ in range(repeat):  # one of each per round, the order rotating: drift hits all alike
            for way in order:
                runs[way].append(timed(ways[way]))
            order = order[1:] + order[:1]
        ctx.close()
        figures = {"runs": runs}
    else:
        raise SystemExit(f"unknown child mode {mode}")
    figures["import_seconds"] = import_seconds
    figures["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(figures))


def run_child(mode: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", mode, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench child {mode} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- images ------------------------------------------------------------------------------------

def build_images(sizes: list[int]) -> dict[int, str]:
    import docker

    client = docker.from_env()
    base = os.environ.get("STUB_BASE_IMAGE") or "runner-base:bookworm"
    print(f"building {STUB_IMAGE} from {base}", flush=True)
    # rm/forcerm: docker-py keeps the builder's intermediate containers unless told not to.
    client.images.build(path=str(REPO / "containers" / "stub"), tag=STUB_IMAGE, buildargs={"BASE_IMAGE": base},
                        rm=True, forcerm=True)
    images = {}
    for files in sizes:
        tag = f"agentissue-runner-bench:{files}"
        started = time.perf_counter()
        client.images.build(
            path=str(REPO / "bench"), dockerfile="Dockerfile.synthetic", tag=tag,
            buildargs={"BASE_IMAGE": STUB_IMAGE, "FILES": str(files), "BINARY_MB": str(TREES[files])},
            rm=True, forcerm=True,
        )
        print(f"built {tag} ({files} files, {TREES[files]} MB binary) in {time.perf_counter() - started:.1f} s", flush=True)
        images[files] = tag
    client.close()
    return images


# --- the reference's CLI way -------------------------------------------------------------------

def cli_extract_and_baseline(image: str, dest: Path) -> float:
    dest.mkdir(parents=True)

    def run() -> None:
        container = sh("docker", "create", image, stdout=subprocess.PIPE).stdout.decode().strip()
        try:
            sh("docker", "cp", f"{container}:/app/source_code_buggy/.", str(dest))
        finally:
            sh("docker", "rm", container)
        sh("git", "init", "-q", cwd=dest)
        sh("git", "add", ".", cwd=dest)
        # gc.auto=0: its detached gc would repack for seconds beside the next measurement
        sh("git", "-c", "gc.auto=0", "-c", "user.name=b", "-c", "user.email=b@example.invalid", "commit", "-qm", "baseline",
           cwd=dest)

    return timed(run)


def touch_100_files(tree: Path) -> None:
    sources = sorted(tree.glob("pkg000/mod*/file*.py"))[:99]
    for path in sources:
        with path.open("a") as handle:
            handle.write("# changed by the benchmark\n")
    (tree / "pkg000" / "added_by_bench.py").write_text("ADDED = True\n")


# --- the measurements --------------------------------------------------------------------------

def measure_extract(images: dict[int, str], scratch: Path, repeat: int) -> dict:
    results = {}
    for files, image in images.items():
        runner_runs, cli_runs, rss, imports = [], [], [], []
        # A small tree takes well under a second, where one noisy run moves the ratio: more runs.
        for attempt in range(repeat if files > 1000 else max(repeat, 7)):
            order = ("runner", "cli") if attempt % 2 == 0 else ("cli", "runner")
            for way in order:
                dest = scratch / f"{way}-{files}"
                remove_tree(dest)
                if way == "runner":
                    figures = run_child("extract", image, str(dest), "-")
                    runner_runs.append(figures["seconds"])
                    rss.append(figures["peak_rss_mib"])
                    imports.append(figures["import_seconds"])
                else:
                    cli_runs.append(cli_extract_and_baseline(image, dest))
        results[files] = {
            "runner_seconds": min(runner_runs),
            "cli_seconds": min(cli_runs),
            "ratio": min(runner_runs) / min(cli_runs),
            "runner_peak_rss_mib": max(rss),
            "runner_import_seconds": min(imports),
        }
        print(f"extract+baseline {files:>6} files: runner {min(runner_runs):6.2f} s  cli {min(cli_runs):6.2f} s  "
              f"ratio {results[files]['ratio']:.2f}  runner peak RSS {max(rss):.0f} MiB", flush=True)
    return results


def measure_patch(scratch: Path, files: int) -> dict:
    runner_tree, cli_tree = scratch / f"runner-{files}", scratch / f"cli-{files}"
    touch_100_files(runner_tree / "buggy-source")
    touch_100_files(cli_tree)
    commit = subprocess.run(
        ["git", "--git-dir", str(runner_tree / ".baseline.git"), "rev-parse", "HEAD"],
        capture_output=True, text=True, check=True, env=GIT_ENV,
    ).stdout.strip()
    runner = run_child("patch", str(runner_tree), commit)
    cli_seconds = timed(lambda: cli_patch(cli_tree, scratch / "cli.patch"))
    result = {"files_changed": runner["changed_files"], "runner_seconds": runner["seconds"],
              "cli_seconds": cli_seconds, "ratio": runner["seconds"] / cli_seconds}
    print(f"patch export, 100 files changed in {files}: runner {runner['seconds']:.3f} s  "
          f"cli {cli_seconds:.3f} s  ratio {result['ratio']:.2f}", flush=True)
    return result


def cli_patch(tree: Path, out_path: Path) -> None:
    """The CLI way: stage everything, diff the index against HEAD."""
    sh("git", "add", "-A", cwd=tree)
    with out_path.open("wb") as out:
        subprocess.run(["git", "diff", "--cached", "--binary", "HEAD"], cwd=tree, env=GIT_ENV, stdout=out, check=True)


PATCH_TREES = (100, 10_000, 100_000)


def raw_gits_patch(git: list[str], root: Path, commit: str) -> float:
    """The least the phase's rules allow, for scale: the gits it runs (the listing, two at once;
    staging the listed paths; the diff) started bare, with no prefix and no Python work around them;
    their seconds. The phase must know every changed path and its size before git reads any, so it
    cannot stage in the same process that lists, as ``git add -A`` does."""
    import shutil

    from runner.phases.patch import DIFF_OPTIONS

    env = {**GIT_ENV, "GIT_INDEX_FILE": str(root / ".baseline.git" / "bench-floor-index")}
    shutil.copy2(root / ".baseline.git" / "index", env["GIT_INDEX_FILE"])  # as the phase's own index, untimed
    started = time.perf_counter()
    listings = [subprocess.Popen([*git, *argv], stdout=subprocess.PIPE, env=env)
                for argv in (("diff-files", "--name-only", "-z"), ("ls-files", "-z", "--others", "--exclude-standard"))]
    names = b"".join(process.communicate()[0] for process in listings)
    if names:
        subprocess.run([*git, "update-index", "-z", "--add", "--remove", "--replace", "--stdin"], input=names,
                       env=env, check=True)
        with (root / "bench-floor.patch").open("wb") as out:
            subprocess.run([*git, "diff", "--cached", *DIFF_OPTIONS, commit, "--"], stdout=out, env=env, check=True)
    return time.perf_counter() - started


def measure_patch_sizes(scratch: Path, repeat: int) -> dict:
    """Patch export on trees of 100, 10,000 and 100,000 files (4 KiB of text each, generated, no
    image), with 100 of them changed and one added (all of them for the smallest), and unchanged:
    the runner's phase (its baseline made as the runner makes it) against ``git add -A; git diff
    --cached --binary HEAD`` on a copy, alternating, the index put back between rounds (outside
    the timing), the best of ``repeat`` each."""
    from runner.jobroot import JobRoot
    from runner.phases.baseline import build_baseline

    results: dict = {}
    for files in PATCH_TREES:
        source = scratch / f"patch-src-{files}"
        sh(sys.executable, str(REPO / "bench" / "generate_tree.py"), str(source), str(files), "4096", "0")
        runner_root, cli_tree = scratch / f"patch-runner-{files}", scratch / f"patch-cli-{files}"
        runner_root.mkdir(parents=True)
        sh("cp", "-a", str(source), str(runner_root / "buggy-source"))
        sh("cp", "-a", str(source), str(cli_tree))
        remove_tree(source)
        commit = build_baseline(JobRoot.at(runner_root, "bench"))
        sh("git", "init", "-q", cwd=cli_tree)
        sh("git", "add", "-A", cwd=cli_tree)
        sh("git", "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "baseline", cwd=cli_tree)
        runner_git = ["git", "--git-dir", str(runner_root / ".baseline.git"), "--work-tree", str(runner_root / "buggy-source")]
        for case in ("unchanged", "changed"):
            if case == "changed":
                for tree in (runner_root / "buggy-source", cli_tree):
                    paths = sorted(tree.glob("pkg*/mod*/file*.py"))[:100]
                    for path in paths:
                        with path.open("a") as handle:
                            handle.write("# changed by the benchmark\n")
                    (tree / "pkg000" / "added_by_bench.py").write_text("ADDED = True\n")
            runner_runs, cli_runs, floor_runs, changed = [], [], [], 0
            for attempt in range(repeat):
                for way in (("runner", "cli", "floor") if attempt % 2 == 0 else ("floor", "cli", "runner")):
                    if way == "runner":
                        figures = run_child("patch", str(runner_root), commit)
                        runner_runs.append(figures["seconds"])
                        changed = figures["changed_files"]
                        sh(*runner_git, "read-tree", "-m", commit)
                    elif way == "cli":
                        cli_runs.append(timed(lambda: cli_patch(cli_tree, scratch / "cli.patch")))
                        sh("git", "read-tree", "-m", "HEAD", cwd=cli_tree)
                    else:
                        floor_runs.append(raw_gits_patch(runner_git, runner_root, commit))
            best_runner, best_cli, best_floor = min(runner_runs), min(cli_runs), min(floor_runs)
            results[f"{files}_{case}"] = {"files": files, "files_changed": changed, "runner_seconds": best_runner,
                                          "cli_seconds": best_cli, "ratio": best_runner / best_cli,
                                          "raw_gits_seconds": best_floor, "raw_gits_ratio": best_floor / best_cli}
            print(f"patch export, {files:>6} files, {case:>9} ({changed:>3} in the patch): runner {best_runner:.3f} s  "
                  f"cli {best_cli:.3f} s  ratio {best_runner / best_cli:.2f}  (the phase's gits alone "
                  f"{best_floor:.3f} s, ratio {best_floor / best_cli:.2f})", flush=True)
        remove_tree(runner_root)
        remove_tree(cli_tree)
    return results


# The reference script's evaluate step (evaluate_selected_tag_container), verbatim but for
# no-op apply and test commands: the CLI way the runner replaces. Apply's success is a file the
# container writes to a host mount; the runner gets both answers without mounting anything.
REFERENCE_EVAL_SCRIPT = (
    'set -euo pipefail; eval "$PATCH_APPLY_SH"; touch /markers/patch_applied; '
    'eval "$PATCH_TEST_SH"; touch /markers/test_success'
)


def reference_eval_argv(patch_dir: Path, marker_dir: Path, network: str = "bridge") -> list[str]:
    return ["docker", "run", "--platform", "linux/amd64", "--rm", "--network", network, "--entrypoint", "bash",
            "-v", f"{patch_dir}:/patches:ro", "-v", f"{marker_dir}:/markers",
            "-e", "PATCH_APPLY_SH=true", "-e", "PATCH_TEST_SH=true", STUB_IMAGE, "-lc", REFERENCE_EVAL_SCRIPT]


def bare_run_argv(patch_dir: Path, network: str = "bridge") -> list[str]:
    """The least a CLI evaluation can do: one mount, one shell, no markers."""
    return ["docker", "run", "--rm", "--network", network, "--entrypoint", "bash", "-v", f"{patch_dir}:/patches:ro",
            STUB_IMAGE, "-c", "true && true"]


def measure_evaluate(scratch: Path, repeat: int) -> dict:
    """The evaluate phase against the CLI's ``docker run --rm`` doing the same, on the default bridge
    (which has no route out on this machine) and with no network at all (``--eval-network none``)."""
    patch_dir, marker_dir = scratch / "patches", scratch / "markers"
    patch_dir.mkdir(exist_ok=True)
    marker_dir.mkdir(exist_ok=True)
    (patch_dir / "attempt.patch").write_text("--- a/x\n+++ b/x\n")
    result = {}
    for network in ("bridge", "none"):
        runs = run_child("evaluate", STUB_IMAGE, str(scratch / f"eval-job-{network}"), str(repeat), str(patch_dir),
                         str(marker_dir), network)["runs"]
        median = {way: statistics.median(seconds) for way, seconds in runs.items()}
        figures = {"runner_seconds": median["runner"], "cli_seconds": median["reference"],
                   "bare_cli_seconds": median["bare"], "ratio": median["runner"] / median["reference"],
                   "ratio_vs_bare": median["runner"] / median["bare"], "runs_each": repeat}
        result["network_bridge" if network == "bridge" else "network_none"] = figures
        print(f"evaluate overhead, network {network} (create, copy in, no-op apply+test, remove): runner "
              f"{median['runner']:.3f} s  reference docker run --rm {median['reference']:.3f} s  ratio "
              f"{figures['ratio']:.2f}  (bare docker run --rm {median['bare']:.3f} s, ratio {figures['ratio_vs_bare']:.2f})",
              flush=True)
    return result


def measure_batches(scratch: Path, tasks: int, worker_counts: list[int]) -> dict:
    walls = {}
    for workers in worker_counts:
        jobs = scratch / f"batch-{workers}"
        remove_tree(jobs)
        for index in range(tasks):
            (jobs / f"bench_{index}" / "context").mkdir(parents=True)
            (jobs / f"bench_{index}" / "context" / "prompt.md").write_text("fake-codex-mode: fix\n")
        argv = [sys.executable, "-m", "runner", "--execute", "--jobs-dir", str(jobs), "--workers", str(workers),
                "--image", STUB_IMAGE, "--codex-bin", str(CODEX_BIN),
                *[arg for index in range(tasks) for arg in ("--tag", f"bench_{index}")]]
        started = time.perf_counter()
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
        walls[workers] = time.perf_counter() - started
        summary = json.loads(done.stdout)
        if done.returncode != 0 or summary["resolved"] != tasks:
            raise SystemExit(f"batch with {workers} workers failed: {done.stdout[-2000:]}")
        remove_tree(jobs)
    result = {str(w): {"wall_seconds": walls[w], "tasks_per_minute": tasks / walls[w] * 60,
                       "speedup": walls[worker_counts[0]] / walls[w]} for w in worker_counts}
    for workers in worker_counts:
        figures = result[str(workers)]
        print(f"batch of {tasks} stub tasks, {workers} worker(s): {figures['wall_seconds']:.1f} s  "
              f"{figures['tasks_per_minute']:.1f} tasks/min  speedup {figures['speedup']:.2f}", flush=True)
    return {"tasks": tasks, "by_workers": result}


# --- a suite's view: the extraction cache, the runner's own overhead, attempts, the daemon ------

def measure_cache(image: str, files: int, scratch: Path, repeat: int) -> dict:
    """A cached attempt's extract + baseline against the first attempt's (which fills the cache)
    and against the reference's CLI way, on the same tree, side by side."""
    firsts, cached, clis, uncached = [], [], [], []
    for round_ in range(repeat):
        cache = scratch / f"cache-{round_}"
        remove_tree(cache)
        for dest in ("first", "cached", "cli", "uncached"):
            remove_tree(scratch / f"{dest}-{files}")
        uncached.append(run_child("extract", image, str(scratch / f"uncached-{files}"), "-")["seconds"])
        first = run_child("extract", image, str(scratch / f"first-{files}"), str(cache))
        firsts.append(first["seconds"])
        for _ in range(3):  # a checkout is under a second, where this machine's noise is large: best of three
            remove_tree(scratch / f"cached-{files}")
            hit = run_child("extract", image, str(scratch / f"cached-{files}"), str(cache))
            if first["from_cache"] or not hit["from_cache"]:
                raise SystemExit("the cache did not behave: the first attempt must fill it, the next ones take it")
            cached.append(hit["seconds"])
        clis.append(cli_extract_and_baseline(image, scratch / f"cli-{files}"))
        remove_tree(cache)
    result = {
        "files": files,
        "first_attempt_seconds": min(firsts),
        "cached_attempt_seconds": min(cached),
        "no_cache_seconds": min(uncached),
        "cli_seconds": min(clis),
        "ratio_cached_vs_first": min(cached) / min(firsts),
        "ratio_cached_vs_no_cache": min(cached) / min(uncached),
        "ratio_cached_vs_cli": min(cached) / min(clis),
        "fill_cost_ratio": min(firsts) / min(uncached),
    }
    print(f"extract+baseline, {files} files: cached attempt {min(cached):.2f} s  first attempt (fills the cache) "
          f"{min(firsts):.2f} s  ratio {result['ratio_cached_vs_first']:.3f}  | no cache {min(uncached):.2f} s  "
          f"cli {min(clis):.2f} s  cached/cli {result['ratio_cached_vs_cli']:.3f}", flush=True)
    return result


def _prompts(jobs: Path, tags: list[str], prompt: str) -> None:
    for tag in tags:
        (jobs / tag / "context").mkdir(parents=True, exist_ok=True)
        (jobs / tag / "context" / "prompt.md").write_text(prompt)


def _docker_runs(count: int, at_once: int) -> float:
    """``count`` times ``docker run --rm IMAGE true``, ``at_once`` at a time: the least a task costs."""
    from concurrent.futures import ThreadPoolExecutor

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=at_once) as pool:
        list(pool.map(lambda _i: sh("docker", "run", "--rm", "--entrypoint", "true", STUB_IMAGE), range(count)))
    return time.perf_counter() - started


def _runner_batch(jobs: Path, tags: list[str], workers: int, *extra: str,
                  env: dict[str, str] | None = None) -> tuple[float, dict]:
    argv = [sys.executable, "-m", "runner", "--execute", "--jobs-dir", str(jobs), "--workers", str(workers),
            "--codex-bin", str(CODEX_BIN), *[arg for tag in tags for arg in ("--tag", tag)], *extra]
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"batch failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall, json.loads(done.stdout)


# The ways a batch's tasks run, for the overhead: its default (tasks forked by its fork server, the
# default bridge network, which has no route out here), no network at all, and every task cold.
OVERHEAD_WAYS = {
    "": ((), {}),
    "network_none": (("--eval-network", "none"), {}),
    "cold_start": ((), {"RUNNER_FORK_SERVER": "0"}),
}


def measure_overhead(scratch: Path, tasks: int) -> dict:
    """Everything that is not the agent or the task's test: a no-op codex (the fake, which edits
    two files at once) and no-op apply and test commands, per task, against ``docker run --rm``."""
    result = {}
    for workers in (1, 4):
        docker_wall = _docker_runs(tasks, workers)  # the baseline, once per slot count
        for way, (flags, env) in OVERHEAD_WAYS.items():
            jobs = scratch / f"overhead-{workers}{way}"
            remove_tree(jobs)
            tags = [f"bench_{i}" for i in range(tasks)]
            _prompts(jobs, tags, "fake-codex-mode: fix\n")
            runner_wall, summary = _runner_batch(
                jobs, tags, workers, "--image", STUB_IMAGE, "--apply-cmd", "true", "--test-cmd", "true",
                "--cache-dir", str(scratch / f"overhead-cache-{workers}{way}"), *flags, env={**os.environ, **env},
            )
            if summary["ran"] != tasks or summary["exit_code_resolved"] != tasks:  # each evaluated, exit 0
                raise SystemExit(f"overhead batch did not complete: {summary}")
            remove_tree(jobs)
            figures = {"tasks": tasks, "runner_seconds_per_task": runner_wall / tasks,
                       "docker_run_rm_seconds_per_task": docker_wall / tasks, "ratio": runner_wall / docker_wall}
            name = ("sequential" if workers == 1 else f"{workers}_slots") + (f"_{way}" if way else "")
            result[name] = figures
            print(f"runner overhead per task, {workers} at once{', ' + way.replace('_', ' ') if way else ''}: runner "
                  f"{figures['runner_seconds_per_task']:.2f} s  docker run --rm "
                  f"{figures['docker_run_rm_seconds_per_task']:.2f} s  ratio {figures['ratio']:.2f}", flush=True)
    return result


def _suite_images(count: int) -> list[str]:
    """``count`` images with ids of their own (the stub plus a label), tagged as the suite's tags'."""
    import io

    import docker

    client = docker.from_env()
    tags = []
    try:
        for i in range(count):
            tag = f"bsuite_{i}"
            dockerfile = f"FROM {STUB_IMAGE}\nLABEL io.agentissue-runner.bench-tag={tag}\n".encode()
            client.images.build(fileobj=io.BytesIO(dockerfile), tag=f"alfin06/agentissue-bench:{tag}", rm=True)
            tags.append(tag)
    finally:
        client.close()
    return tags


def _remove_images(tags: list[str]) -> None:
    for tag in tags:
        subprocess.run(["docker", "rmi", f"alfin06/agentissue-bench:{tag}"], capture_output=True)


def measure_suite(scratch: Path, tags_count: int, attempts: int, workers: int) -> dict:
    """A suite of ``tags_count`` tags x ``attempts`` attempts in one batch (the cache on) against the
    same number of independent single runs (``--execute`` each, the cache off), ``workers`` at a time."""
    from concurrent.futures import ThreadPoolExecutor

    tags = _suite_images(tags_count)
    try:
        jobs = scratch / "suite"
        remove_tree(jobs)
        _prompts(jobs, tags, "fake-codex-mode: fix\n")
        suite_wall, summary = _runner_batch(
            jobs, tags, workers, "--attempts", str(attempts), "--cache-dir", str(scratch / "suite-cache"),
        )
        if summary["resolved"] != tags_count * attempts:
            raise SystemExit(f"the suite did not resolve every attempt: {summary}")
        remove_tree(jobs)
        _prompts(jobs, tags, "fake-codex-mode: fix\n")  # the same batch, the cache off: what the cache saves
        uncached_wall, _summary = _runner_batch(jobs, tags, workers, "--attempts", str(attempts), "--cache-max-gb", "0")
        remove_tree(jobs)

        singles = scratch / "singles"
        remove_tree(singles)
        units = [(tag, i) for tag in tags for i in range(1, attempts + 1)]
        for tag, i in units:
            _prompts(singles, [f"{tag}-{i}"], "fake-codex-mode: fix\n")

        def single(unit: tuple[str, int]) -> int:
            tag, i = unit
            return subprocess.run(
                [sys.executable, "-m", "runner", "--execute", "--job-root", str(singles / f"{tag}-{i}"), "--tag", tag,
                 "--codex-bin", str(CODEX_BIN), "--cache-max-gb", "0"],
                cwd=REPO, capture_output=True,
            ).returncode

        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            codes = list(pool.map(single, units))
        singles_wall = time.perf_counter() - started
        if any(codes):
            raise SystemExit(f"single runs failed: {codes}")
        remove_tree(singles)
    finally:
        _remove_images(tags)
    result = {"tags": tags_count, "attempts": attempts, "workers": workers, "suite_seconds": suite_wall,
              "single_runs_seconds": singles_wall, "ratio": suite_wall / singles_wall,
              "suite_cache_off_seconds": uncached_wall, "ratio_vs_cache_off": suite_wall / uncached_wall}
    print(f"suite of {tags_count} tags x {attempts} attempts, {workers} workers: {suite_wall:.1f} s  "
          f"{len(units)} single runs {singles_wall:.1f} s  ratio {result['ratio']:.2f}  "
          f"(the same suite with the cache off {uncached_wall:.1f} s, ratio {result['ratio_vs_cache_off']:.2f})",
          flush=True)
    return result


def _codex_with_stamps(scratch: Path) -> tuple[Path, Path]:
    """The fake codex behind a shell wrapper that stamps the instant the codex phase starts it."""
    stamps = scratch / "stamps"
    stamps.mkdir(parents=True, exist_ok=True)
    wrapper = scratch / "codex-stamped"
    wrapper.write_text(
        "#!/bin/sh\n"
        'd=""; prev=""; for a in "$@"; do [ "$prev" = "--cd" ] && d="$a"; prev="$a"; done\n'
        f'[ -n "$d" ] && date +%s.%N > "{stamps}/$(echo "$d" | tr / _)"\n'
        f'exec {sys.executable} {FAKE_CODEX} "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper, stamps


def _tree_rss_mib(pid: int) -> tuple[float, float]:
    """(this process's RSS, its whole process tree's RSS), in MiB."""
    def rss(p: int) -> float:
        return _status_mib(p, "VmRSS")

    def children(p: int) -> list[int]:
        found = []
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                found += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
        return found

    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += rss(current)
        todo += children(current)
    return rss(pid), total


def measure_daemon(scratch: Path, broker: str, rounds: int, submit_tasks: int) -> dict:
    """Time from ``submit`` to the codex phase starting on an idle worker; submit throughput; the
    worker's peak RSS with 4 busy slots. Needs a Redis (``--broker``)."""
    import uuid

    import redis

    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    wrapper, stamps = _codex_with_stamps(scratch)
    codex_home = scratch / "codex-home"
    codex_home.mkdir(exist_ok=True)
    (codex_home / "auth.json").write_text("{}\n")
    prompts, jobs = scratch / "daemon-prompts", scratch / "daemon-jobs"
    jobs.mkdir(exist_ok=True)
    env = {**os.environ, "CODEX_HOME": str(codex_home), "RUNNER_CACHE_DIR": str(scratch / "daemon-cache")}
    common = ["--broker", broker, "--namespace", namespace]

    def submit(suite: str, tags: list[str], *extra: str) -> float:
        argv = [sys.executable, "-m", "runner", "submit", *common, "--suite", suite, "--prompts-dir", str(prompts),
                "--image", STUB_IMAGE, *[a for t in tags for a in ("--tag", t)], *extra]
        started = time.perf_counter()
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise SystemExit(f"submit failed: {done.stderr[-2000:]}")
        return time.perf_counter() - started

    worker = subprocess.Popen(
        [sys.executable, "-m", "runner", "worker", *common, "--jobs-dir", str(jobs), "--codex-bin", str(wrapper),
         "--name", "bench", "--slots", "4", "--check-interval", "5", "--min-free-gb", "0"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    client = redis.Redis.from_url(broker)
    try:
        for line in worker.stderr:
            if "worker_started" in line:
                break
        else:
            raise SystemExit("the worker did not start")
        threading_drain(worker)
        latencies, submit_walls = [], []
        for round_ in range(rounds + 1):  # the first round warms the cache (one extraction); not counted
            tag = f"lat_{round_}"
            _prompts(prompts, [tag], "fake-codex-mode: fix\n")
            started = time.time()
            submit_wall = submit(f"latency-{round_}", [tag])
            stamp = _wait_for_stamp(stamps, f"latency-{round_}")
            if round_:
                latencies.append(stamp - started)
                submit_walls.append(submit_wall)
            _wait_idle(client, namespace, f"latency-{round_}", 1)

        busy_tags = [f"busy_{i}" for i in range(4)]
        _prompts(prompts, busy_tags, "fake-codex-sleep: 6\nfake-codex-mode: fix\n")
        submit("busy", busy_tags)
        peak_worker, peak_tree = 0.0, 0.0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            own, tree = _tree_rss_mib(worker.pid)
            peak_worker, peak_tree = max(peak_worker, own), max(peak_tree, tree)
            if _finished(client, namespace, "busy") == 4:
                break
            time.sleep(0.1)
        hwm = _status_mib(worker.pid, "VmHWM")

        flood = [f"flood_{i}" for i in range(submit_tasks)]
        _prompts(prompts, flood, "fake-codex-mode: fix\n")
        flood_seconds = submit("flood", flood, "--queue", "bench-nobody")  # no worker takes them
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=120)
        except subprocess.TimeoutExpired:
            worker.kill()
        for key in client.scan_iter(f"{namespace}*"):
            client.delete(key)
        for key in client.scan_iter(f"dramatiq:*{namespace}*"):
            client.delete(key)
        client.close()
    result = {
        "submit_to_codex_seconds_median": statistics.median(latencies),
        "submit_to_codex_seconds_max": max(latencies),
        "submit_command_seconds_median": statistics.median(submit_walls),  # its own process, start to exit
        "rounds": rounds,
        "submit_tasks": submit_tasks,
        "submit_seconds": flood_seconds,
        "submit_tasks_per_second": submit_tasks / flood_seconds,
        "worker_peak_rss_mib_4_busy_slots": max(peak_worker, hwm),
        "worker_and_tasks_peak_rss_mib": peak_tree,
    }
    print(f"daemon: submit -> codex on an idle worker median {result['submit_to_codex_seconds_median']:.2f} s "
          f"(max {result['submit_to_codex_seconds_max']:.2f} s; the submit command itself "
          f"{result['submit_command_seconds_median']:.2f} s); submit {submit_tasks} tasks in {flood_seconds:.2f} s "
          f"= {result['submit_tasks_per_second']:.0f} tasks/s; worker peak RSS with 4 busy slots "
          f"{result['worker_peak_rss_mib_4_busy_slots']:.0f} MiB (with its tasks {peak_tree:.0f} MiB)", flush=True)
    return result


def threading_drain(process: subprocess.Popen) -> None:
    """Keep reading the worker's log so its pipe never fills."""
    import threading

    threading.Thread(target=lambda: [None for _ in process.stderr], daemon=True).start()


def _wait_for_stamp(stamps: Path, suite: str, timeout: float = 120) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in stamps.glob(f"*_{suite}_*"):
            text = path.read_text().strip()
            if text:
                return float(text)
        time.sleep(0.005)
    raise SystemExit(f"codex never started for {suite}")


def _finished(client, namespace: str, suite: str) -> int:
    from runner.fleet.broker import Keys
    from runner.fleet.ledger import SuiteLedger, TaskState

    rows = SuiteLedger(client, Keys(namespace), suite).rows()
    return sum(1 for row in rows if row.state in (TaskState.DONE, TaskState.FAILED))


def _wait_idle(client, namespace: str, suite: str, tasks: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while _finished(client, namespace, suite) < tasks:
        if time.monotonic() > deadline:
            raise SystemExit(f"{suite} did not finish")
        time.sleep(0.1)


def _status_mib(pid: int, field: str) -> float:
    """A memory figure of /proc/<pid>/status (VmRSS, VmHWM), in MiB; 0 once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


PARTS = ("extract", "patch", "evaluate", "batch", "cache", "overhead", "suite", "daemon")


def engine_version() -> str:
    import docker

    client = docker.from_env()
    try:
        return str(client.version().get("Version", "unknown"))
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="skip the 100,000-file tree; fewer repeats")
    parser.add_argument("--only", choices=PARTS, action="append",
                        help="measure only this part (repeatable); extract includes the patch export and peak RSS")
    parser.add_argument("--scratch", type=Path, default=Path("/dev/shm/runner-bench"))
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--batch-tasks", type=int, default=8)
    parser.add_argument("--broker", default=os.environ.get("RUNNER_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"),
                        help="a Redis for the daemon's figures (default redis://127.0.0.1:6379/14)")
    parser.add_argument("--output", type=Path, default=None,
                        help="default: bench/results/latest.json, or latest-<parts>.json with --only")
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1:])
        return
    parts = args.only or list(PARTS)
    output = args.output or REPO / "bench" / "results" / (
        f"latest-{'-'.join(sorted(set(args.only)))}.json" if args.only else "latest.json")
    sizes = [1000, 20000] if args.quick else sorted(TREES)
    repeat = args.repeat or (2 if args.quick else 3)
    report: dict = {"date": time.strftime("%Y-%m-%d"),
                    "machine": {"cpus": os.cpu_count(), "docker_engine": engine_version(),
                                "scratch": "tmpfs" if str(args.scratch).startswith("/dev/shm") else "disk"}}
    targets: dict[str, bool] = {}
    print(f"Docker Engine {report['machine']['docker_engine']}", flush=True)
    remove_tree(args.scratch)
    args.scratch.mkdir(parents=True)
    global CODEX_BIN
    CODEX_BIN = direct_fake_codex(args.scratch)
    try:
        images = build_images(sizes if "extract" in parts else ([20000] if "cache" in parts else []))
        if "extract" in parts:
            extract = measure_extract(images, args.scratch, repeat)
            biggest = extract[max(extract)]
            report["extract_and_baseline"] = {str(k): v for k, v in extract.items()}
            report["patch_export_100_files"] = measure_patch(args.scratch, 20000)
            report["peak_rss_mib_biggest_tree"] = biggest["runner_peak_rss_mib"]
            targets["extract_and_baseline_ratio_at_most_1_0"] = all(v["ratio"] <= 1.0 for v in extract.values())
            targets["peak_rss_under_150_mib"] = biggest["runner_peak_rss_mib"] < 150
        if "patch" in parts:
            report["patch_export"] = measure_patch_sizes(args.scratch, 5 if args.quick else 9)
            targets["patch_export_ratio_at_most_1_0"] = all(v["ratio"] <= 1.0 for v in report["patch_export"].values())
        if "evaluate" in parts:
            report["evaluate_overhead"] = measure_evaluate(args.scratch, 15 if args.quick else 30)
            for name, figures in report["evaluate_overhead"].items():
                targets[f"evaluate_overhead_{name}_ratio_at_most_1_1"] = figures["ratio"] <= 1.1
        if "batch" in parts:
            report["batch_throughput"] = measure_batches(args.scratch, args.batch_tasks, [1, 2, 4])
        if "cache" in parts:
            report["extraction_cache"] = measure_cache(images[20000], 20000, args.scratch, repeat)
            targets["cached_attempt_at_most_0_1_of_first"] = report["extraction_cache"]["ratio_cached_vs_first"] <= 0.1
        if "overhead" in parts:
            report["runner_overhead"] = measure_overhead(args.scratch, 8)
            for name, figures in report["runner_overhead"].items():
                if not name.endswith("cold_start"):  # the way before the fork server: a comparison, no target
                    targets[f"runner_overhead_{name}_at_most_2_5x_docker_run"] = figures["ratio"] <= 2.5
        if "suite" in parts:
            report["suite_with_attempts"] = measure_suite(args.scratch, 8, 4, 4)
            targets["suite_8x4_at_most_0_8_of_32_single_runs"] = report["suite_with_attempts"]["ratio"] <= 0.8
        if "daemon" in parts:
            report["daemon"] = measure_daemon(args.scratch, args.broker, 5, 500)
            targets["submit_to_codex_under_1_s"] = report["daemon"]["submit_to_codex_seconds_median"] < 1.0
    finally:
        remove_tree(args.scratch)
    report["targets"] = targets
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    for name, met in targets.items():
        print(f"target {name}: {'met' if met else 'NOT MET'}")
    print(f"figures written to {output.relative_to(REPO) if output.is_relative_to(REPO) else output}")


if __name__ == "__main__":
    main()
