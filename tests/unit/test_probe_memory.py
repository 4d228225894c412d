"""The host's memory of the network probe's answer: what is kept, for how long, and what is never believed."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from runner.network_probe import NetworkProbe, ProbeMemory

ENDPOINTS = ("mirror.internal:3141",)


def _reached() -> NetworkProbe:
    return NetworkProbe(reachable=True, detail="reachable", endpoints=ENDPOINTS)


def test_a_definite_answer_is_recalled_for_the_same_question_only(tmp_path: Path) -> None:
    memory = ProbeMemory(tmp_path)
    memory.remember("bridge", _reached())
    recalled = memory.recall("bridge", ENDPOINTS)
    assert recalled == NetworkProbe(reachable=True, detail="reachable", endpoints=ENDPOINTS, remembered=True)
    assert memory.recall("host", ENDPOINTS) is None  # another network mode
    assert memory.recall("bridge", ("pypi.org:443",)) is None  # other endpoints
    unreached = NetworkProbe(reachable=False, detail="unreachable", endpoints=("a:1", "b:2"), unreached="b:2")
    memory.remember("bridge", unreached)
    assert memory.recall("bridge", ("a:1", "b:2")) == NetworkProbe(
        reachable=False, detail="unreachable", endpoints=("a:1", "b:2"), unreached="b:2", remembered=True)


def test_an_answer_older_than_a_minute_or_from_the_future_is_asked_again(tmp_path: Path) -> None:
    memory = ProbeMemory(tmp_path)
    memory.remember("bridge", _reached())
    (record,) = tmp_path.glob("*.json")
    for probed_at in (time.time() - 61, time.time() + 3600):
        data = json.loads(record.read_text())
        data["probed_at"] = probed_at
        record.write_text(json.dumps(data))
        assert memory.recall("bridge", ENDPOINTS) is None
    assert ProbeMemory(tmp_path, max_age=7200).recall("bridge", ENDPOINTS) is None  # the future one still


def test_a_probe_that_could_not_tell_is_not_remembered(tmp_path: Path) -> None:
    memory = ProbeMemory(tmp_path)
    for detail in ("probe_unavailable", "probe_failed"):
        memory.remember("bridge", NetworkProbe(reachable=None, detail=detail, endpoints=ENDPOINTS))
    assert list(tmp_path.iterdir()) == []
    assert memory.recall("bridge", ENDPOINTS) is None


def test_a_damaged_or_planted_record_is_never_believed(tmp_path: Path) -> None:
    memory = ProbeMemory(tmp_path)
    memory.remember("bridge", _reached())
    (record,) = tmp_path.glob("*.json")
    good = record.read_text()
    for bad in ("{", "[]", json.dumps({**json.loads(good), "reachable": "yes"}),
                json.dumps({**json.loads(good), "extra": 1}), json.dumps({**json.loads(good), "network": "host"}),
                "x" * 10_000):
        record.write_text(bad)
        assert memory.recall("bridge", ENDPOINTS) is None, bad[:40]
    record.unlink()
    os.symlink("/etc/hostname", record)  # a link is not the runner's own record
    assert memory.recall("bridge", ENDPOINTS) is None


def test_a_state_dir_that_cannot_hold_the_memory_costs_only_the_memory(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    memory = ProbeMemory(blocked / "network-probes")  # under a regular file: nothing can be created
    with memory.turn("bridge", ENDPOINTS):
        memory.remember("bridge", _reached())
    assert memory.recall("bridge", ENDPOINTS) is None
