"""The development tools' child-process helpers: stopping by PID, waiting with a reason."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from compass_dev.processes import stop, wait_for


def test_stop_kills_a_child_that_ignores_sigterm() -> None:
    ignores = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", ignores], stdout=subprocess.PIPE)
    assert child.stdout is not None
    child.stdout.readline()  # the handler is in place
    stop(child, grace_s=0.5, kill_wait_s=5)  # TimeoutExpired if even SIGKILL did not end it
    assert child.returncode == -signal.SIGKILL  # SIGTERM was ignored: it took the kill
    stop(child, grace_s=0.5, kill_wait_s=5)  # already gone: nothing to do
    stop(None, grace_s=0.5, kill_wait_s=5)


def test_wait_for_returns_the_value_or_names_what_it_waited_for() -> None:
    assert wait_for(lambda: 7, 1, "seven") == 7
    with pytest.raises(TimeoutError, match="waiting for nothing"):
        wait_for(lambda: None, 0.2, "nothing", interval_s=0.05)
