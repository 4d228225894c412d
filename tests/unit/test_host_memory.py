"""The host's memory (runner/host_memory.py): what is kept, for how long, what is never believed,
and the network probe's rule on top of it (only a definite answer is kept)."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from runner.host_memory import HostMemory
from runner.network_probe import NetworkProbe, recall_probe, remember_probe

ENDPOINTS = ("mirror.internal:3141",)


class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    value: int


def test_a_fact_answers_only_the_question_it_was_found_for(tmp_path: Path) -> None:
    memory = HostMemory(tmp_path, max_age=60)
    question = HostMemory.question("layout", "sha256:abc", "/app")
    memory.remember(question, Answer(value=5))
    assert memory.recall(question, Answer) == Answer(value=5)
    assert memory.recall(HostMemory.question("layout", "sha256:abd", "/app"), Answer) is None
    (record,) = tmp_path.glob("*.json")
    data = json.loads(record.read_text())
    data["question"] = HostMemory.question("layout", "sha256:other", "/app")  # a record moved under another name
    record.write_text(json.dumps(data))
    assert memory.recall(question, Answer) is None


def test_an_old_or_future_fact_is_found_out_again_and_none_means_for_good(tmp_path: Path) -> None:
    question = HostMemory.question("q")
    HostMemory(tmp_path, max_age=60).remember(question, Answer(value=1))
    (record,) = tmp_path.glob("*.json")
    data = json.loads(record.read_text())
    for found_at, max_age, believed in ((time.time() - 61, 60, False), (time.time() - 86400 * 365, None, True),
                                        (time.time() + 3600, None, False)):
        record.write_text(json.dumps({**data, "found_at": found_at}))
        assert (HostMemory(tmp_path, max_age=max_age).recall(question, Answer) is not None) is believed


def test_a_damaged_or_planted_record_is_never_believed(tmp_path: Path) -> None:
    memory = HostMemory(tmp_path, max_age=None)
    question = HostMemory.question("q")
    memory.remember(question, Answer(value=1))
    (record,) = tmp_path.glob("*.json")
    good = json.loads(record.read_text())
    for bad in ("{", "[]", json.dumps({**good, "fact": {"value": "1"}}), json.dumps({**good, "extra": 1}),
                json.dumps({**good, "fact": {"value": 1, "more": 2}}), "x" * 100_000):
        record.write_text(bad)
        assert memory.recall(question, Answer) is None, bad[:40]
    record.unlink()
    os.symlink("/etc/hostname", record)  # a link out of the memory's directory
    assert memory.recall(question, Answer) is None


def test_a_state_dir_that_cannot_hold_the_memory_costs_only_the_memory(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    memory = HostMemory(blocked / "kind", max_age=None)  # under a regular file: nothing can be created
    with memory.turn("q"):
        memory.remember("q", Answer(value=1))
    assert memory.recall("q", Answer) is None


def _find_out(directory: str, question: str, counter: str) -> None:
    memory = HostMemory(Path(directory), max_age=None)
    with memory.turn(question):
        if memory.recall(question, Answer) is None:
            with open(counter, "a") as out:
                out.write("x")
            time.sleep(0.3)  # a probe taking its time while the others wait
            memory.remember(question, Answer(value=1))


def test_processes_asking_at_once_find_the_fact_out_once(tmp_path: Path) -> None:
    counter = tmp_path / "found"
    processes = [multiprocessing.get_context("spawn").Process(target=_find_out, args=(str(tmp_path / "m"), "q", str(counter)))
                 for _ in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    assert counter.read_text() == "x"


def test_only_a_definite_network_answer_is_kept(tmp_path: Path) -> None:
    memory = HostMemory(tmp_path, max_age=60)
    for detail in ("probe_unavailable", "probe_failed"):
        remember_probe(memory, "bridge", NetworkProbe(reachable=None, detail=detail, endpoints=ENDPOINTS))
    assert recall_probe(memory, "bridge", ENDPOINTS) is None and list(tmp_path.glob("*.json")) == []
    unreached = NetworkProbe(reachable=False, detail="unreachable", endpoints=("a:1", "b:2"), unreached="b:2")
    remember_probe(memory, "bridge", unreached)
    assert recall_probe(memory, "bridge", ("a:1", "b:2")) == NetworkProbe(
        reachable=False, detail="unreachable", endpoints=("a:1", "b:2"), unreached="b:2", remembered=True)
    assert recall_probe(memory, "host", ("a:1", "b:2")) is None  # another network mode
    assert recall_probe(memory, "bridge", ("a:1",)) is None  # other endpoints
