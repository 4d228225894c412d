"""reduce: markers to the three public files, each through the guard.

Invariant: reads only markers and the compact files it wrote; never Docker,
codex or log content. ``--reduce`` calls the same entry point.
"""

from __future__ import annotations

import json

from reducers.compact import reduce_markers, reduce_real_result
from reducers.markers import read_markers
from reducers.models import ReduceResult
from runner.errors import CompactInputError
from runner.jobroot import BENCHMARK_RESULT, BENCHMARK_RUN, REAL_RESULT, JobRoot
from runner.public import private_texts_for, publish


def _read_compact(job_root: JobRoot, name: str) -> object:
    try:
        return json.loads(job_root.public(name).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise CompactInputError(name, "", f"not readable JSON ({type(e).__name__})") from e


def reduce_job(job: JobRoot) -> ReduceResult:
    """Raises: CompactInputError (a marker or compact file is bad), PublicSafetyError."""
    markers = read_markers(job.markers)
    run_doc, result_doc = reduce_markers(markers)
    private = private_texts_for(job.root)
    publish(job.public(BENCHMARK_RUN), run_doc, private_texts=private)
    publish(job.public(BENCHMARK_RESULT), result_doc, private_texts=private)
    real = reduce_real_result(_read_compact(job, BENCHMARK_RUN), _read_compact(job, BENCHMARK_RESULT))
    publish(job.public(REAL_RESULT), real, private_texts=private)
    return ReduceResult(
        resolved=bool(result_doc["official_task_score"]["resolved"]),
        terminal_state=str(result_doc["terminal_state"]),
        first_failed_phase=result_doc["first_failed_phase"],
        failure_label=str(result_doc["failure_attribution_labels"][0]),
    )
