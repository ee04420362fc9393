"""Test-only: a process kills itself (SIGKILL) at a named point, so that fault tests can stop a
runner at an exact moment of its work -- after a chunk of validated lines is stored, after the
plan is stored, after result bytes are fsynced, inside the commit before it is sent -- and check
that a restart loses and doubles nothing. A test that needs the process frozen there instead (a
coordinator stalled past its lease) asks for SIGSTOP.

``SGLBLEND_TEST_KILL_AT=POINT:N[:stop]`` (or `arm`, in a process forked from one that preloaded
this module) kills (or stops) the process the N-th time it reaches POINT. Nothing sets it outside
the tests; unarmed, a point costs one comparison.
"""

from __future__ import annotations

import os
import signal

KILL_AT_ENV = "SGLBLEND_TEST_KILL_AT"
_SIGNALS = {"": signal.SIGKILL, "kill": signal.SIGKILL, "stop": signal.SIGSTOP}
# The point, how many more times it is passed before the signal, and the signal.
_armed: list = [None, 0, signal.SIGKILL]


def arm(spec: str) -> None:
    """``POINT:N[:stop]`` (N defaults to 1), or empty to disarm."""
    point, _, rest = spec.partition(":")
    count, _, action = rest.partition(":")
    if action not in _SIGNALS:
        raise ValueError(f"{spec!r}: the action after POINT:N is 'kill' or 'stop', not {action!r}")
    _armed[:] = [point or None, int(count or 1), _SIGNALS[action]]


def kill_point(name: str) -> None:
    if name == _armed[0]:
        _armed[1] -= 1
        if _armed[1] == 0:
            os.kill(os.getpid(), _armed[2])


arm(os.environ.get(KILL_AT_ENV, ""))
