"""Moved to ``tests.support.faults`` (admission's tests and the bench use it too)."""

from tests.support.faults import Reply, fault_proxy, silent_registry

__all__ = ["Reply", "fault_proxy", "silent_registry"]
