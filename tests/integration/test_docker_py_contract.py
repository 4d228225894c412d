"""What the runner relies on inside docker-py, pinned against the installed version and a real engine.

``archive_stream_with_stat`` takes the HTTP response of ``get_archive`` from docker-py's
generator frame (docker-py offers no handle to it), so that closing the stream closes the
socket and a forced removal never waits for it. If a docker-py release moves that local,
this test fails, naming the version, before any run hangs on a removal.
"""

from __future__ import annotations

import time

import docker
import pytest
import requests

from runner.docker_utils import archive_stream_with_stat, managed_container, runner_labels

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]


def test_the_archive_stream_holds_docker_pys_response_and_closing_it_frees_the_container(
    docker_client, stub_image: str
) -> None:
    labels = runner_labels(job_id="contract", run_id="contract", phase="extract")
    with managed_container(docker_client, image=stub_image, labels=labels, network_disabled=True) as container:
        stream, stat = archive_stream_with_stat(container, "/app/source_code_buggy")
        reader = stream.raw
        response = reader._response
        assert isinstance(response, requests.Response), (
            f"docker-py {docker.__version__}: get_archive's generator no longer keeps 'response' in its frame"
        )
        assert stat["name"] == "source_code_buggy"
        assert stream.read(512)  # the tar stream is being read, half-way
        stream.close()
        assert response.raw.closed, f"docker-py {docker.__version__}: closing the stream left the socket open"
        started = time.monotonic()
    assert time.monotonic() - started < 10  # the forced removal did not wait for a stream
