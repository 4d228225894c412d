"""Docker's boundary is one module: runner/docker_utils.py.

The rule, as this test reads the code (``ast``): outside docker_utils no module touches a
Docker client's collections (``.containers``, ``.images``, ``.networks``, ``.volumes``,
``.api``), calls a method only containers have (``put_archive``, ``get_archive``,
``attach``, ``exec_run``, ...), or calls any method but ``close`` on a ``client`` or a
``container`` (the names the runner gives Docker's objects); ``import docker`` is for
its types and errors only. Subprocesses' ``.wait()`` and threads' ``.start()`` pass.
"""

from __future__ import annotations

import ast
from pathlib import Path

RUNNER = Path(__file__).resolve().parents[2] / "runner"
BOUNDARY = RUNNER / "docker_utils.py"
COLLECTIONS = {"containers", "images", "networks", "volumes", "api"}
CONTAINER_ONLY = {"put_archive", "get_archive", "attach", "attach_socket", "exec_run", "inspect_container"}
DOCKER_OBJECTS = {"client", "container", "docker_client"}
# Redis and HTTP clients are called client too; their modules never hold a Docker client.
NOT_DOCKER = {RUNNER / "fleet" / "broker.py", RUNNER / "fleet" / "commands.py", RUNNER / "fleet" / "views.py",
              RUNNER / "fleet" / "ledger.py", RUNNER / "fleet" / "leases.py", RUNNER / "fleet" / "budget.py",
              RUNNER / "views" / "sources.py"}


def docker_calls_outside_the_boundary(source: str, *, redis_module: bool = False) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in COLLECTIONS and isinstance(node.value, ast.Name) \
                and node.value.id in DOCKER_OBJECTS and not redis_module:
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        method, receiver = node.func.attr, node.func.value
        if method in CONTAINER_ONLY:
            found.append(f"line {node.lineno}: .{method}()")
        elif isinstance(receiver, ast.Name) and receiver.id in DOCKER_OBJECTS and method != "close" \
                and not redis_module:
            found.append(f"line {node.lineno}: {receiver.id}.{method}()")
        elif isinstance(receiver, ast.Name) and receiver.id == "docker" and method != "from_env":
            found.append(f"line {node.lineno}: docker.{method}()")
    return found


def test_no_module_but_docker_utils_calls_docker() -> None:
    offenders = {}
    for path in sorted(RUNNER.rglob("*.py")):
        if path == BOUNDARY:
            continue
        calls = docker_calls_outside_the_boundary(path.read_text(), redis_module=path in NOT_DOCKER)
        if calls:
            offenders[str(path.relative_to(RUNNER.parent))] = calls
    assert not offenders, f"Docker called outside runner/docker_utils.py: {offenders}"


def test_the_rule_sees_what_the_phases_used_to_do() -> None:
    before = (
        "with managed_container(client, image=i, labels=l) as container:\n"
        "    container.put_archive('/', data)\n"
        "    container.start()\n"
        "    status = container.wait(timeout=5)\n"
        "client.images.get(tag)\n"
    )
    assert len(docker_calls_outside_the_boundary(before)) == 4
    fine = "child = subprocess.Popen(argv)\nchild.wait()\nthread.start()\nclient.close()\n"
    assert docker_calls_outside_the_boundary(fine) == []
