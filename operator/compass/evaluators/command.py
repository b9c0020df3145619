"""An evaluator that runs the user's own command to score a configuration on samples."""

from __future__ import annotations

import atexit
import contextlib
import json
import operator
import os
import select
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import IO, cast

from compass.domain.evaluation import Config, EvaluationError
from compass.domain.space import config_key
from compass.evaluators.files import MiB, describe_size

STDERR_TAIL_LINES = 20
# After a kill, wait this long for the pipes to close before giving up on the output.
_REAP_TIMEOUT_S = 5.0
# The most a command may print on stdout (scores take a few dozen bytes each), against floods.
STDOUT_BYTES_PER_SAMPLE = 64
STDOUT_MIN_BYTES = MiB
# Of stderr only the tail is shown: this much of it is kept.
_STDERR_KEPT_BYTES = 64 * 1024
# The wait wakes this often, so a Ctrl-C handled on another thread is acted on at once.
_WAKE_S = 0.1
_READ_BYTES = 64 * 1024


class _Ended(Enum):
    """How a command's I/O ended."""

    CLOSED = "closed"  # both output pipes reached their end
    TIMEOUT = "timeout"
    OVERFLOW = "overflow"  # stdout passed its limit


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
                # Its own process group: a timeout or an interrupt kills what it started too.
                start_new_session=True,
            )
        except OSError as exc:
            raise self._fail(
                config, f"cannot start {self.argv[0]!r} ({exc.strerror}); check the command path"
            ) from None
        _RUNNING.add(process.pid)
        try:
            stdout, stderr = self._communicate(
                config, process, request.encode("utf-8"), len(sample_indices)
            )
        except EvaluationError:
            raise  # a timeout or a flood: _communicate has ended the group already
        except BaseException:
            # Ctrl-C, SIGTERM or a failure: its own session got no signal; end it and its children.
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
        self, config: Config, process: subprocess.Popen[bytes], request: bytes, samples: int
    ) -> tuple[bytes, bytes]:
        """The command's stdout and stderr; a timeout or a flood kills its group and raises."""
        limit = STDOUT_MIN_BYTES + STDOUT_BYTES_PER_SAMPLE * samples
        io = _Pipes(process, request)
        try:
            ended = io.pump(time.monotonic() + self.timeout_s, limit)
            if ended is _Ended.CLOSED:
                ended = _wait(process, time.monotonic() + self.timeout_s)
            if ended is not _Ended.CLOSED:
                # The group may already be gone if the command exited just as this fired.
                _kill_group(process.pid)
                # Its stderr for the message, briefly: a descendant may hold the pipes open.
                io.pump(time.monotonic() + _REAP_TIMEOUT_S, None)
                process.kill()
                _wait(process, time.monotonic() + _REAP_TIMEOUT_S)
                if ended is _Ended.OVERFLOW:
                    what = (
                        f"it printed more than {describe_size(limit)} on stdout for {samples} "
                        "sample(s); print only the JSON list of scores, one per sample"
                    )
                else:
                    what = (
                        f"timed out after {self.timeout_s:g} s; make it faster or raise the timeout"
                    )
                raise self._fail(config, what, io.stderr())
            return bytes(io.out), io.stderr()
        finally:
            io.close()

    def _parse(self, config: Config, expected: int, stdout: bytes, stderr: bytes) -> list[float]:
        """Scores from stdout: a JSON list of numbers, or an object with a "scores" list."""
        shape = 'print a JSON list of scores, or {"scores": [...]}, one per sample'
        text = stdout.decode("utf-8", errors="replace").strip()
        if not text:
            raise self._fail(config, f"it printed nothing on stdout; {shape}", stderr)
        try:
            output = json.loads(text)
        except (ValueError, RecursionError):  # also a number past int()'s digit limit
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
                what = f"{json.dumps(score)}, not a number"
            elif not 0.0 <= score <= 1.0:  # NaN fails both comparisons
                what = f"{score!r}, outside [0, 1]"
            else:
                result.append(float(score))
                continue
            rule = "every score must be a number in [0, 1]"
            raise self._fail(config, f"score {position} is {what}; {rule}", stderr)
        return result


class _Pipes:
    """A started command's three pipes, served together without blocking on any one."""

    def __init__(self, process: subprocess.Popen[bytes], request: bytes) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        assert process.stderr is not None
        self.process = process
        self.request = memoryview(request)
        self.written = 0
        self.out = bytearray()
        self.err = bytearray()
        self.selector = selectors.DefaultSelector()
        if request:
            self.selector.register(process.stdin, selectors.EVENT_WRITE)
        else:
            process.stdin.close()
        self.selector.register(process.stdout, selectors.EVENT_READ)
        self.selector.register(process.stderr, selectors.EVENT_READ)

    def _done_with(self, pipe: IO[bytes]) -> None:
        self.selector.unregister(pipe)
        with contextlib.suppress(OSError):
            pipe.close()

    def pump(self, deadline: float, limit: int | None) -> _Ended:
        """Move bytes until both outputs end, the deadline passes or stdout passes ``limit``."""
        process = self.process
        while any(key.fileobj is not process.stdin for key in self.selector.get_map().values()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return _Ended.TIMEOUT
            for key, _ in self.selector.select(min(remaining, _WAKE_S)):
                if key.fileobj is process.stdin:
                    self._write(key.fd)
                    continue
                data = os.read(key.fd, _READ_BYTES)
                if not data:
                    self._done_with(cast(IO[bytes], key.fileobj))
                elif key.fileobj is process.stdout:
                    self.out += data
                    if limit is not None and len(self.out) > limit:
                        return _Ended.OVERFLOW
                else:
                    self.err += data
                    if len(self.err) > 2 * _STDERR_KEPT_BYTES:
                        del self.err[:-_STDERR_KEPT_BYTES]
        return _Ended.CLOSED

    def _write(self, fd: int) -> None:
        """Write the next piece of the request (at most PIPE_BUF: that never blocks)."""
        try:
            self.written += os.write(
                fd, self.request[self.written : self.written + select.PIPE_BUF]
            )
        except BrokenPipeError:
            # It stopped reading (or exited): its output says what went wrong.
            self.written = len(self.request)
        if self.written >= len(self.request):
            self._done_with(cast(IO[bytes], self.process.stdin))

    def stderr(self) -> bytes:
        return bytes(self.err[-_STDERR_KEPT_BYTES:])

    def close(self) -> None:
        """Close whatever pipe is still open."""
        self.selector.close()
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()


def _wait(process: subprocess.Popen[bytes], deadline: float) -> _Ended:
    """Wait for the process to exit, waking every _WAKE_S (see there); TIMEOUT at deadline."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return _Ended.TIMEOUT
        try:
            process.wait(timeout=min(remaining, _WAKE_S))
        except subprocess.TimeoutExpired:
            continue
        return _Ended.CLOSED
