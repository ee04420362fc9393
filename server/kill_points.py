"""Test-only: a process kills itself (SIGKILL) at a named point, so that fault tests can stop a
runner at an exact moment of its work -- after a chunk of validated lines is stored, after the
plan is stored, after result bytes are fsynced, inside the commit before it is sent -- and check
that a restart loses and doubles nothing.

``SGLBLEND_TEST_KILL_AT=POINT:N`` (or `arm`, in a process forked from one that preloaded this
module) kills the process the N-th time it reaches POINT. Nothing sets it outside the tests;
unarmed, a point costs one comparison.
"""

from __future__ import annotations

import os
import signal

KILL_AT_ENV = "SGLBLEND_TEST_KILL_AT"
_armed: list = [None, 0]  # the point, and how many more times it is passed before the kill


def arm(spec: str) -> None:
    """``POINT:N`` (N defaults to 1), or empty to disarm."""
    point, _, count = spec.partition(":")
    _armed[:] = [point or None, int(count or 1)]


def kill_point(name: str) -> None:
    if name == _armed[0]:
        _armed[1] -= 1
        if _armed[1] == 0:
            os.kill(os.getpid(), signal.SIGKILL)


arm(os.environ.get(KILL_AT_ENV, ""))
