"""An evaluator that runs the user's own command to score a configuration on samples."""

from __future__ import annotations

import atexit
import contextlib
import json
import operator
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from compass.domain.evaluation import Config, EvaluationError
from compass.domain.space import config_key

STDERR_TAIL_LINES = 20
# After a kill, wait this long for the pipes to close before giving up on the output.
_REAP_TIMEOUT_S = 5.0


# Process groups of commands still running: ended at exit, whatever way the run ends.
_RUNNING: set[int] = set()


def _kill_group(pgid: int) -> None:
    """SIGKILL a command's process group (it may be gone already)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


@atexit.register
def _kill_running() -> None:
    """End every command still running, and what it started, when compass exits."""
    for pgid in list(_RUNNING):
        _kill_group(pgid)


class CommandEvaluator:
    """Runs `argv` once per evaluate(): config and samples as JSON on stdin, scores on stdout."""

    def __init__(
        self,
        argv: Sequence[str],
        timeout_s: float = 600,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`env` adds to (and overrides) the current environment rather than replacing it."""
        if not argv:
            raise ValueError("the evaluator command is empty; give the program and its arguments")
        self.argv = list(argv)
        self.timeout_s = timeout_s
        self.cwd = cwd
        self.env = None if env is None else {**os.environ, **env}
        self.name = Path(self.argv[0]).name

    def _fail(self, config: Config, what: str, stderr: bytes = b"") -> EvaluationError:
        """An error whose first line says it all; the stderr tail follows on later lines."""
        message = (
            f"evaluator command {self.name} failed on configuration {config_key(config)}: {what}"
        )
        tail = stderr.decode("utf-8", errors="replace").rstrip().splitlines()[-STDERR_TAIL_LINES:]
        if tail:
            message += f"\nstderr (last {len(tail)} lines):\n" + "\n".join(tail)
        return EvaluationError(message)

    def evaluate(self, config: Config, sample_indices: Sequence[int]) -> list[float]:
        """Per-sample scores in [0, 1] from one run of the command, in the order given."""
        request = json.dumps(
            {"config": dict(config), "samples": [operator.index(i) for i in sample_indices]}
        )
        try:
            process = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=self.cwd,
                env=self.env,
                # Its own process group, so a timeout or an interrupt kills whatever the
                # command started too.
                start_new_session=True,
            )
        except OSError as exc:
            raise self._fail(
                config, f"cannot start {self.argv[0]!r} ({exc.strerror}); check the command path"
            ) from None
        _RUNNING.add(process.pid)
        try:
            stdout, stderr = self._communicate(config, process, request.encode("utf-8"))
        except EvaluationError:
            raise  # a timeout: _communicate has ended the group already
        except BaseException:
            # Ctrl-C, SIGTERM (main() raises it) or a failure here: the command has its own
            # session, so the terminal's signal never reached it; end it and its children.
            _kill_group(process.pid)
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=_REAP_TIMEOUT_S)
            raise
        finally:
            _RUNNING.discard(process.pid)
        if process.returncode < 0:
            reason = f"killed by signal {signal.Signals(-process.returncode).name}"
            raise self._fail(config, reason, stderr)
        if process.returncode:
            raise self._fail(config, f"exit code {process.returncode}", stderr)
        return self._parse(config, len(sample_indices), stdout, stderr)

    def _communicate(
        self, config: Config, process: subprocess.Popen[bytes], request: bytes
    ) -> tuple[bytes, bytes]:
        """The command's stdout and stderr; on timeout its group is killed and this raises."""
        try:
            stdout, stderr = process.communicate(request, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            # The group may already be gone if the command exited just as the timeout fired.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            try:
                stdout, stderr = process.communicate(timeout=_REAP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                # A descendant that left the group still holds the pipes; do not wait on it.
                process.kill()
                stderr = b""
            raise self._fail(
                config,
                f"timed out after {self.timeout_s:g} s; make it faster or raise the timeout",
                stderr,
            ) from None
        return stdout, stderr

    def _parse(self, config: Config, expected: int, stdout: bytes, stderr: bytes) -> list[float]:
        """Scores from stdout: a JSON list of numbers, or an object with a "scores" list."""
        shape = 'print a JSON list of scores, or {"scores": [...]}, one per sample'
        text = stdout.decode("utf-8", errors="replace").strip()
        if not text:
            raise self._fail(config, f"it printed nothing on stdout; {shape}", stderr)
        try:
            output = json.loads(text)
        except json.JSONDecodeError:
            start = text[:200].replace("\n", "\\n")
            raise self._fail(
                config, f"stdout is not JSON (starts with {start!r}); {shape}", stderr
            ) from None
        scores = output.get("scores") if isinstance(output, dict) else output
        if not isinstance(scores, list):
            raise self._fail(config, f"stdout JSON has no list of scores; {shape}", stderr)
        if len(scores) != expected:
            raise self._fail(
                config, f"it returned {len(scores)} scores for {expected} samples; {shape}", stderr
            )
        result: list[float] = []
        for position, score in enumerate(scores):
            if isinstance(score, bool) or not isinstance(score, int | float):
                raise self._fail(
                    config,
                    f"score {position} is {json.dumps(score)}, not a number; "
                    "every score must be a number in [0, 1]",
                    stderr,
                )
            if not 0.0 <= score <= 1.0:  # NaN fails both comparisons
                raise self._fail(
                    config,
                    f"score {position} is {score!r}, outside [0, 1]; "
                    "every score must be a number in [0, 1]",
                    stderr,
                )
            result.append(float(score))
        return result
