"""The stub task image, built by the runner itself from the files shipped with the package.

The build context is ``runner/canary/stub`` (the repository's ``containers/stub``,
shipped as package data). The tag carries a hash of the context, so a changed
stub is rebuilt and an unchanged one is reused. Nothing is pulled: on a host
without a registry the base image (``--canary-base-image``) must be present.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

import docker
from docker.errors import BuildError, DockerException

from runner.docker_utils import build_image, image_present
from runner.errors import EnvironmentNotReadyError

REPOSITORY = "agentissue-runner-stub"


def stub_context() -> Path:
    """Raises: EnvironmentNotReadyError when the package was installed without its stub files."""
    context = Path(str(resources.files("runner.canary").joinpath("stub"))).resolve()
    if not (context / "Dockerfile").is_file():
        raise EnvironmentNotReadyError(
            "the stub image's files are missing from the installed package (runner/canary/stub); reinstall it",
            reason="canary_stub_missing",
        )
    return context


def context_digest(context: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(path.relative_to(context).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def ensure_stub_image(client: docker.DockerClient, base_image: str) -> tuple[str, bool]:
    """The stub image's tag, built when missing; returns (tag, built now).

    Raises:
        EnvironmentNotReadyError: the base image is missing or the build failed (names the flag).
    """
    context = stub_context()
    base_digest = hashlib.sha256(base_image.encode()).hexdigest()[:6]
    tag = f"{REPOSITORY}:canary-{context_digest(context)[:12]}-{base_digest}"
    if image_present(client, tag):
        return tag, False
    if not image_present(client, base_image):
        raise EnvironmentNotReadyError(
            f"the canary's base image {base_image} is not present; pull it, or pass --canary-base-image "
            "with a local Debian-like image that has bash, git, python3 and GNU patch",
            reason="canary_base_image_missing",
        )
    try:
        build_image(client, str(context), tag=tag, buildargs={"BASE_IMAGE": base_image},
                    labels={"io.agentissue-runner.canary": "true"})
    except BuildError as e:
        reason = next((str(line.get("error", "")) for line in e.build_log if "error" in line), "")[:200]
        raise EnvironmentNotReadyError(
            f"building the stub image failed ({reason or 'see the Docker daemon log'}); "
            "the base (--canary-base-image) needs bash, git, python3 and GNU patch",
            reason="canary_build_failed",
        ) from e
    except DockerException as e:
        raise EnvironmentNotReadyError(
            f"building the stub image failed ({type(e).__name__})", reason="canary_build_failed"
        ) from e
    return tag, True
