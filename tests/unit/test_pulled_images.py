"""The pull record (``runner.images.PulledImages``) without an engine: a local hit of an image the
runner did not pull neither locks nor writes the record; one it pulled has its last use moved."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from runner.images import PULLED_RECORD, PulledImages


def test_a_hit_on_an_image_the_runner_did_not_pull_touches_nothing(tmp_path: Path) -> None:
    PulledImages(tmp_path).used("sha256:" + "1" * 64)
    assert not (tmp_path / PULLED_RECORD).parent.exists()  # no record, no lock file, no directory

    record = PulledImages(tmp_path)
    record.pulled(SimpleNamespace(id="sha256:" + "2" * 64, attrs={"Size": 7}), "reg/x:t", None)
    before = (tmp_path / PULLED_RECORD).stat().st_mtime_ns, (tmp_path / PULLED_RECORD).read_bytes()
    record.used("sha256:" + "1" * 64)
    assert ((tmp_path / PULLED_RECORD).stat().st_mtime_ns, (tmp_path / PULLED_RECORD).read_bytes()) == before


def test_a_hit_on_a_pulled_image_moves_its_last_use(tmp_path: Path) -> None:
    record = PulledImages(tmp_path)
    image_id = "sha256:" + "3" * 64
    record.pulled(SimpleNamespace(id=image_id, attrs={"Size": 7}), "reg/x:t", "sha256:" + "4" * 64)
    [first] = record.entries()
    record.used(image_id)
    [after] = record.entries()
    assert after.last_used > first.last_used and after.pulled_at == first.pulled_at
