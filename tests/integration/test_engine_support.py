"""The second host's engine (``tests/engine_support.py``) is a host of its own, and it goes entirely:
its images are not the first engine's, its containers sit on its own bridge, and once stopped its
dockerd, bridge, socket and directories are gone."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import base_image, runner_containers
from tests.engine_support import start_engine

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]


def test_a_second_engine_is_a_host_of_its_own_and_leaves_nothing(docker_client) -> None:
    base = base_image(docker_client)
    engine = start_engine(docker_client, images=(base,))
    try:
        assert engine.client.info()["DockerRootDir"] != docker_client.info()["DockerRootDir"]
        engine.client.images.get(base).tag("runner-engine-test", "only-here")
        assert [i for i in docker_client.images.list("runner-engine-test")] == []  # not on the first engine
        bridge = engine.client.networks.get("bridge").attrs["IPAM"]["Config"][0]["Subnet"]
        first = docker_client.networks.get("bridge").attrs["IPAM"]["Config"][0]["Subnet"]
        assert bridge != first
        assert runner_containers(engine.client) == []
    finally:
        engine.stop()
    assert subprocess.run(["ip", "link", "show", engine.bridge], capture_output=True).returncode != 0
    assert not engine.directory.exists() and not engine.data.exists()
