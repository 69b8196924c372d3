"""Other processes on this machine: whether one is still alive.

The cache, the commit of a local write and torch's shared-memory slots all keep
files or bytes that name the process that made them, and let go of what a dead
process left. One rule for "dead" here.

This module does not import TensorFlow.
"""

from __future__ import annotations

import os

__all__ = ["pid_alive"]


def pid_alive(pid: int) -> bool:
    """True if a process ``pid`` exists on this machine (ours or another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, and belongs to another user
        return True
    return True
