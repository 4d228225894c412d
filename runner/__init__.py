"""The runner: one AgentIssue-Bench task, end to end, on a trusted host."""

__version__ = "0.1.0"
