"""What keeps a run's processes and files in hand, one guard a module.

- ``signals``: SIGINT/SIGTERM from the first instant, and deferred around calls that must finish;
- ``standard_streams``: a reader of stdout/stderr going away never ends a run;
- ``parent_death``: a task process dies with the supervisor that started it;
- ``descendants``: every process the runner started, found and killed (a child subreaper);
- ``agent``: the agent's own processes (a PID namespace, another user), ended with the run;
- ``run_owner``: which live process owns a container, so a sweep removes only dead runs' strays;
- ``runner_files``: the runner's files in the job root, verified and restored after the agent.

Imports nothing here: ``python -m runner`` loads ``signals`` before anything heavy.
"""
