"""Processes that die with their parent (Linux ``PR_SET_PDEATHSIG``).

``broker serve --processes N`` forks N children that share the listening socket; the test
harness starts ``serve`` processes and PostgreSQL clusters. None of them may outlive the process
that started it: a SIGKILLed ``serve`` parent would otherwise leave children answering on its
port, and a killed test run would leave brokers and databases behind. The kernel sends the
chosen signal when the parent *thread* that forked the child exits, so the process that starts
one must do it from a thread that lives as long as it (the main thread).

Elsewhere than Linux this is a no-op: the callers stop their children themselves as well.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

# Resolved once, in the parent: a forked child (preexec_fn) must not dlopen (locks).
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def die_with_parent(signum: int = signal.SIGTERM, parent: int | None = None) -> None:
    """Have the kernel send `signum` to this process when its parent exits. `parent` is the
    pid the caller expects as its parent: when that one died before the request took effect
    (the child was reparented already), the signal is sent at once."""
    if _prctl is None:
        return
    if _prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signum)


def preexec_die_with_parent(signum: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``subprocess.Popen(preexec_fn=...)`` that makes the child die with the calling
    process. It runs after Popen's ``user=``/``group=`` switch, which would clear it."""
    parent = os.getpid()

    def preexec() -> None:
        die_with_parent(signum, parent)

    return preexec
