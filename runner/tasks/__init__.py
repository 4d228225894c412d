"""A task, the one contract every driver (a single run, a batch, the fleet) hands to the supervisor.

``spec`` is what the operator said about a task and what the host has; ``protocol`` the
messages a task process and a fleet exchange; ``supervisor`` runs a task in a process
of its own; ``process`` is that process.
"""
