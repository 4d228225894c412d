"""A Docker Engine of a test's own: a second host, for a fleet whose workers must not share one engine.

``start_engine`` starts a dockerd with everything of its own (socket, data root, exec root, pidfile,
containerd namespaces, a bridge on a subnet no interface here uses, ``--iptables=false``), loads into
it the images the test names (from the engine the tests use), and ``Engine.stop`` ends it and removes
its bridge and its directories. The ``second_engine`` fixture stops it at teardown, also when the test
failed, after failing the test that left a runner container on it.

Needs root and dockerd (``ip`` for the bridge): without them the fixture skips, naming why; under
``CI=true`` it fails instead (.ci/run runs as root and installs what it needs).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import IN_CI, base_image, runner_containers

START_SECONDS = 60


def _problem() -> str | None:
    if os.geteuid() != 0:
        return "a Docker Engine of the test's own needs root (dockerd, a bridge)"
    for binary in ("dockerd", "ip"):
        if shutil.which(binary) is None:
            return f"a Docker Engine of the test's own needs {binary} on PATH (.ci/run installs it)"
    return None


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 that no address or route here overlaps (the other engines' bridges included)."""
    used = []
    shown = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True).stdout
    routes = subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True, check=True).stdout
    for word in (shown + " " + routes).split():
        try:
            used.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            continue
    for third in range(10, 250):
        candidate = ipaddress.ip_network(f"172.29.{third}.0/24")
        if not any(candidate.overlaps(network) for network in used if network.prefixlen > 0):
            return candidate
    raise RuntimeError("no free 172.29.x.0/24 subnet for the test's engine bridge")


class Engine:
    """One dockerd of the test's own; ``host`` is its DOCKER_HOST, ``client`` a Docker SDK client of it."""

    def __init__(self) -> None:
        self.name = f"rt{uuid.uuid4().hex[:8]}"  # a bridge name has at most 15 characters
        # Short paths: containerd's socket lives under the exec root, and a unix socket path is short.
        self.directory = Path(tempfile.mkdtemp(prefix="runner-eng-"))
        # The images on a disk: /tmp may be a tmpfs (Debian's default since trixie), /var/tmp is not.
        on_disk = "/var/tmp" if os.path.isdir("/var/tmp") else None
        self.data = Path(tempfile.mkdtemp(prefix="runner-eng-data-", dir=on_disk))
        self.socket = self.directory / "docker.sock"
        self.host = f"unix://{self.socket}"
        self.bridge = self.name
        self.client = None
        self._process: subprocess.Popen[bytes] | None = None
        self._bridge_made = False

    @property
    def log(self) -> str:
        path = self.directory / "dockerd.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def start(self) -> None:
        import docker

        subnet = _free_subnet()
        gateway = f"{next(subnet.hosts())}/{subnet.prefixlen}"
        subprocess.run(["ip", "link", "add", self.bridge, "type", "bridge"], check=True, capture_output=True)
        self._bridge_made = True
        subprocess.run(["ip", "addr", "add", gateway, "dev", self.bridge], check=True, capture_output=True)
        subprocess.run(["ip", "link", "set", self.bridge, "up"], check=True, capture_output=True)
        (self.directory / "daemon.json").write_text("{}\n")  # never the host's /etc/docker/daemon.json
        self._process = subprocess.Popen(
            ["dockerd", "--config-file", str(self.directory / "daemon.json"), "--host", self.host,
             "--data-root", str(self.data), "--exec-root", str(self.directory / "exec"),
             "--pidfile", str(self.directory / "dockerd.pid"), "--containerd-namespace", self.name,
             "--containerd-plugins-namespace", f"{self.name}-plugins", "--bridge", self.bridge,
             "--iptables=false", "--ip-forward=false", "--ip-masq=false"],
            stdout=subprocess.DEVNULL, stderr=open(self.directory / "dockerd.log", "ab"), start_new_session=True,
        )
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            try:
                client = docker.DockerClient(base_url=self.host, timeout=120)
                client.ping()
                self.client = client
                return
            except Exception:  # not answering yet
                time.sleep(0.3)
        raise RuntimeError(f"the test's dockerd did not answer within {START_SECONDS} s: {self.log}")

    def load(self, source_client, image: str) -> None:
        """``image`` from ``source_client``'s engine into this one (docker save | docker load, streamed)."""
        self.client.images.load(source_client.images.get(image).save(named=True))
        self.client.images.get(image)  # raises when it did not arrive

    def stop(self) -> None:
        """End dockerd (its containerd with it), remove its bridge and directories; safe to call twice."""
        if self.client is not None:
            self.client.close()
            self.client = None
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)  # its own session: dockerd and its containerd
                self._process.wait(10)
        self._process = None
        if self._bridge_made:
            subprocess.run(["ip", "link", "delete", self.bridge], check=False, capture_output=True)
            self._bridge_made = False
        for directory in (self.directory, self.data):
            self._unmount_below(directory)
            shutil.rmtree(directory, ignore_errors=True)

    @staticmethod
    def _unmount_below(directory: Path) -> None:
        """Mounts a killed dockerd may have left under its data or exec root (deepest first)."""
        prefix = str(directory.resolve()) + "/"
        with open("/proc/self/mounts") as mounts:
            points = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def start_engine(source_client, images: tuple[str, ...] = ()) -> Engine:
    """A started engine of the test's own holding ``images`` (loaded from ``source_client``'s engine).
    Skips without root or dockerd; under CI=true fails instead."""
    problem = _problem()
    if problem is not None:
        pytest.fail(f"CI=true and {problem}") if IN_CI else pytest.skip(problem)
    engine = Engine()
    try:
        engine.start()
        for image in images:
            engine.load(source_client, image)
    except BaseException:
        engine.stop()  # a half-started engine goes too: its bridge, its dockerd, its data
        raise
    return engine


@pytest.fixture
def second_engine(docker_client) -> Iterator[Engine]:
    """A second host's engine with the stub's base image; the test fails if it leaves a runner
    container there, and the engine goes (bridge and data) whatever the test did."""
    engine = start_engine(docker_client, images=(base_image(docker_client),))
    try:
        yield engine
        leaked = runner_containers(engine.client)
        for container in leaked:
            container.remove(force=True)
        assert not leaked, f"{len(leaked)} runner container(s) left on the second engine: {[c.name for c in leaked]}"
    finally:
        engine.stop()
