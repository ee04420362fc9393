"""A server's processes die with the process that started it, however that one dies.

SIGTERM and Ctrl-C reach the server through the supervisor (`supervisor.ServerProcess.stop`), but
SIGKILL -- the OOM killer, ``systemctl kill -s KILL``, a container runtime -- gives the supervisor
no chance to pass anything on, and the server, in a session of its own, would keep the port, the
data directory and its memory. So the supervisor hands the server the read end of a pipe whose
only write end it keeps (the *lifeline*); nothing is ever written to it. When the supervisor dies,
by whatever signal, the kernel closes the write end, the server's read returns end-of-file, and
the server kills every process under it and then itself.

A pipe rather than ``PR_SET_PDEATHSIG`` for the server itself: the kernel sends the parent-death
signal when the *thread* that forked the child exits, so a server started from a worker thread
would die with that thread; a pipe's write end belongs to the whole process. SGLang's own
scheduler and detokenizer already set ``PR_SET_PDEATHSIG`` towards the server process (SGLang's
``kill_itself_when_parent_died``), and any process under them is killed here by walking the tree.
"""

from __future__ import annotations

import os
import signal
import threading

import psutil

LIFELINE_ENV = "SGLBLEND_LIFELINE_FD"


def open_lifeline() -> tuple[int, int]:
    """A new lifeline: (read end for the child, write end the parent keeps open for as long as it
    lives). Both ends are non-inheritable; the child gets the read end through ``pass_fds``."""
    return os.pipe()


def child_env(read_fd: int) -> dict[str, str]:
    """The variable that tells the child which descriptor is its lifeline."""
    return {LIFELINE_ENV: str(read_fd)}


def watch_parent() -> None:
    """In the server process: when the lifeline the supervisor passed ends, kill the whole server.
    No-op when started without one (a detached server is meant to outlive its launcher)."""
    text = os.environ.pop(LIFELINE_ENV, None)  # SGLang's own children must not inherit it
    if text is None:
        return
    read_fd = int(text)
    os.set_inheritable(read_fd, False)

    def wait_for_end() -> None:
        while os.read(read_fd, 1):
            pass
        kill_own_tree()

    threading.Thread(target=wait_for_end, name="sgl-blend-lifeline", daemon=True).start()


def kill_own_tree() -> None:
    """SIGKILL every descendant of this process, then this process: an abandoned server has no one
    to report a graceful stop to, and its store is safe against a kill at any instant."""
    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    os.kill(os.getpid(), signal.SIGKILL)
