"""The command evaluator, run against real subprocesses: the protocol and each failure mode."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from compass.domain.evaluation import EvaluationError, ParamValue
from compass.evaluators.command import CommandEvaluator

CONFIG: dict[str, ParamValue] = {"retriever_k": 5, "model": "small"}


def _python(
    script: str,
    timeout_s: float = 600,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> CommandEvaluator:
    """An evaluator running a Python script in this test's interpreter."""
    argv = [sys.executable, "-c", textwrap.dedent(script)]
    return CommandEvaluator(argv, timeout_s=timeout_s, cwd=cwd, env=env)


def test_scores_come_back_in_sample_order() -> None:
    """The command sees config and samples on stdin; its JSON list is returned as floats."""
    evaluator = _python(
        """
        import json, sys
        request = json.load(sys.stdin)
        k = request["config"]["retriever_k"]
        print(json.dumps([(i * k % 10) / 10 for i in request["samples"]]))
        """
    )
    assert evaluator.evaluate(CONFIG, [3, 0, 1]) == [0.5, 0.0, 0.5]
    assert evaluator.evaluate(CONFIG, []) == []


def test_object_with_scores_is_accepted_and_ints_become_floats(tmp_path: Path) -> None:
    """{"scores": [...]} works too; cwd and extra env reach the command."""
    (tmp_path / "answer.txt").write_text("1")
    evaluator = _python(
        """
        import json, os, sys
        json.load(sys.stdin)
        value = int(open("answer.txt").read())
        assert os.environ["PATH"], "extra env must not wipe the environment"
        print(json.dumps({"scores": [value, float(os.environ["SECOND"])], "extra": "ignored"}))
        """,
        cwd=tmp_path,
        env={"SECOND": "0.25"},
    )
    scores = evaluator.evaluate(CONFIG, [0, 1])
    assert scores == [1.0, 0.25]
    assert all(type(s) is float for s in scores)


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("import sys; print('boom', file=sys.stderr); sys.exit(3)", "exit code 3"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", "killed by signal SIGTERM"),
        ("print('not json')", "stdout is not JSON (starts with 'not json')"),
        ("pass", "printed nothing on stdout"),
        ("print('[0.5]')", "returned 1 scores for 2 samples"),
        ("print('{\"score\": [0.5, 0.5]}')", "no list of scores"),
        ("print('[0.5, \"x\"]')", 'score 1 is "x", not a number'),
        ("print('[0.5, true]')", "score 1 is true, not a number"),
        ("print('[0.5, 1.5]')", "score 1 is 1.5, outside [0, 1]"),
        ("print('[NaN, 0.5]')", "score 0 is nan, outside [0, 1]"),
    ],
)
def test_failures_name_command_config_and_cause(script: str, expected: str) -> None:
    """Each failure is an EvaluationError whose first line names command, config and cause."""
    evaluator = _python("import json, sys; json.load(sys.stdin)\n" + script)
    with pytest.raises(EvaluationError) as info:
        evaluator.evaluate(CONFIG, [0, 1])
    first_line = str(info.value).splitlines()[0]
    assert first_line.startswith(f"evaluator command {Path(sys.executable).name} failed")
    assert '{"model": "small", "retriever_k": 5}' in first_line
    assert expected in first_line


def test_stderr_tail_is_the_last_twenty_lines() -> None:
    """The error carries the end of stderr, where the real cause usually is."""
    evaluator = _python(
        """
        import sys
        for n in range(50):
            print(f"log line {n}", file=sys.stderr)
        sys.exit(1)
        """
    )
    with pytest.raises(EvaluationError) as info:
        evaluator.evaluate(CONFIG, [0])
    message = str(info.value)
    assert "log line 49" in message
    assert "log line 30" in message
    assert "log line 29" not in message


def test_missing_program_is_an_evaluation_error(tmp_path: Path) -> None:
    """A command that does not exist fails as EvaluationError, naming it."""
    evaluator = CommandEvaluator([str(tmp_path / "no-such-scorer")])
    with pytest.raises(EvaluationError, match=r"no-such-scorer.*cannot start"):
        evaluator.evaluate(CONFIG, [0])


def _alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie (Linux /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="checks process state through /proc")
def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    """A hung command and the children it started are killed, and the error says timeout."""
    pid_file = tmp_path / "pids"
    # It never ends on its own (nor does its child): evaluate() can only return by killing both.
    evaluator = _python(
        f"""
        import os, subprocess, sys, threading
        child = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"])
        open({str(pid_file)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        print("still working", file=sys.stderr, flush=True)
        threading.Event().wait()
        """,
        # Long enough for the command to start its child and say so on a busy machine.
        timeout_s=3.0,
    )
    outcome: list[BaseException] = []

    def evaluate() -> None:
        try:
            evaluator.evaluate(CONFIG, [0])
        except BaseException as error:  # handed to the test's thread
            outcome.append(error)

    caller = threading.Thread(target=evaluate, daemon=True)
    caller.start()
    caller.join(timeout=120)  # bounds a hang only: the command would never return by itself
    assert pid_file.exists(), "the command was stopped before it had started its child"
    command, child = (int(pid) for pid in pid_file.read_text().split())
    try:
        assert not caller.is_alive(), "evaluate() still waits on a command past its timeout"
        [error] = outcome
        assert isinstance(error, EvaluationError)
        message = str(error)
        assert "timed out after 3 s" in message.splitlines()[0]
        assert "still working" in message
        assert not _alive(command)
        _wait_until_gone(child)
    finally:
        for pid in (command, child):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _wait_until_gone(pid: int) -> None:
    """Wait for a killed process to be reaped by init (it was orphaned), bounded against a hang."""
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), f"{pid} outlived its command's timeout"


def test_empty_command_is_rejected() -> None:
    """An empty argv is a configuration mistake caught at construction."""
    with pytest.raises(ValueError, match="empty"):
        CommandEvaluator([])


def test_command_runs_without_a_shell(tmp_path: Path) -> None:
    """Arguments are passed verbatim: shell syntax in them is not interpreted."""
    marker = tmp_path / "pwned"
    evaluator = _python(
        """
        import json, sys
        json.load(sys.stdin)
        print(json.dumps([1.0 if sys.argv[1].startswith("; touch") else 0.0]))
        """
    )
    evaluator.argv.append(f"; touch {marker}")
    assert evaluator.evaluate(CONFIG, [0]) == [1.0]
    assert not marker.exists()


def _grandchild_command(pid_file: Path) -> list[str]:
    """A command that starts a grandchild and waits for it: neither ends by itself."""
    return ["sh", "-c", f"sleep 300 & echo $! > {pid_file}; wait"]


def _pid_from(pid_file: Path) -> int:
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline, "the command never started its grandchild"
        time.sleep(0.02)
    return int(pid_file.read_text())


# Far below the unit tier's budget: a lost Ctrl-C fails the test in a minute, not in 300 s.
_INTERRUPT_TIMEOUT_S = 60
# How soon evaluate() must act on the interrupt (it wakes every 0.1 s): generous for a loaded
# machine, far below the timeout, so that waiting out the timeout cannot pass for success.
_INTERRUPT_BOUND_S = 20


def _interrupted(pid_file: Path, *, on_main_thread: bool) -> float:
    """Run a command that never ends, SIGINT this process once its grandchild is up; return
    how long evaluate() took to raise KeyboardInterrupt.

    The signal goes to one thread by pthread_kill, never to the process (where the kernel
    picks any thread): to the main thread, as a terminal's Ctrl-C usually lands, or to the
    helper thread, where Python's C handler runs but the main thread is not woken.
    """
    evaluator = CommandEvaluator(_grandchild_command(pid_file), timeout_s=_INTERRUPT_TIMEOUT_S)
    main = threading.main_thread().ident
    assert main is not None
    sent = threading.Event()

    def interrupt() -> None:
        _pid_from(pid_file)
        signal.pthread_kill(main if on_main_thread else threading.get_ident(), signal.SIGINT)
        sent.set()

    # A terminal's Ctrl-C reaches Python's default handler; a harness started in the background
    # by a shell without job control inherits SIGINT ignored, where no signal would arrive.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt, daemon=True).start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            evaluator.evaluate(CONFIG, [0])  # the command never ends: only the signal ends this
        elapsed = time.monotonic() - started
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sent.is_set()
    return elapsed


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="checks process state through /proc")
@pytest.mark.parametrize("on_main_thread", [True, False], ids=["main-thread", "other-thread"])
def test_ctrl_c_kills_the_commands_process_group(tmp_path: Path, on_main_thread: bool) -> None:
    """The command has its own session, so Ctrl-C never reaches it: evaluate() must end it,
    at once, whichever thread the signal was handled on."""
    pid_file = tmp_path / "grandchild"
    elapsed = _interrupted(pid_file, on_main_thread=on_main_thread)
    assert elapsed < _INTERRUPT_BOUND_S, f"KeyboardInterrupt took {elapsed:.1f} s"
    grandchild = _pid_from(pid_file)
    try:
        _wait_until_gone(grandchild)
    finally:
        if _alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_a_flood_on_stdout_ends_the_command(tmp_path: Path) -> None:
    """A command printing without end (here a 50-million-digit number) is ended once its
    output passes what its scores could take, with an error, not read into memory whole."""
    evaluator = _python(
        """
        import sys
        sys.stdout.write("1" * 50_000_000)
        """,
        timeout_s=60,
    )
    with pytest.raises(EvaluationError, match=r"printed more than 1\.0 MiB on stdout for 1 "):
        evaluator.evaluate(CONFIG, [0])


def test_a_number_past_the_digit_limit_is_not_json(tmp_path: Path) -> None:
    """A 5,000-digit number is valid JSON that int() refuses: a plain evaluation error."""
    evaluator = _python('print("[" + "1" * 5000 + "]")', timeout_s=60)
    with pytest.raises(EvaluationError, match="stdout is not JSON"):
        evaluator.evaluate(CONFIG, [0])


def test_deeply_nested_output_is_not_json(tmp_path: Path) -> None:
    evaluator = _python('print("[" * 100_000 + "]" * 100_000)', timeout_s=60)
    with pytest.raises(EvaluationError, match="stdout is not JSON"):
        evaluator.evaluate(CONFIG, [0])


def test_a_large_request_is_written_while_stdout_is_read(tmp_path: Path) -> None:
    """A request larger than a pipe holds, and an answer as large, do not deadlock."""
    evaluator = _python(
        """
        import json, sys
        request = json.load(sys.stdin)
        print(json.dumps([1.0] * len(request["samples"])))
        """,
        timeout_s=60,
    )
    assert evaluator.evaluate(CONFIG, list(range(200_000))) == [1.0] * 200_000


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="checks process state through /proc")
def test_sigterm_to_a_search_kills_the_commands_process_group(tmp_path: Path) -> None:
    """`compass search --command` killed with SIGTERM leaves no evaluator process behind."""
    (tmp_path / "space.yaml").write_text(
        "parameters:\n  - {name: k, type: integer, values: [1, 2]}\n"
    )
    pid_file = tmp_path / "grandchild"
    command = f"sh -c 'sleep 300 & echo $! > {pid_file}; wait'"
    package = str(Path(__file__).resolve().parents[2] / "operator")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [package, os.environ.get("PYTHONPATH")])),
    }
    argv = [
        "search",
        "--space",
        "space.yaml",
        "--command",
        command,
        "--samples",
        "10",
        "--tau",
        "0.5",
    ]
    search = subprocess.Popen(
        [sys.executable, "-m", "compass.commands.main", *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        grandchild = _pid_from(pid_file)
        search.terminate()
        _, err = search.communicate(timeout=60)
        # What a shell reports for a command SIGTERM ended (128 + 15), with the resume hint.
        assert search.returncode == 143, err
        assert b"terminated; rerun with --resume" in err
        assert b"Traceback" not in err
        _wait_until_gone(grandchild)
    finally:
        search.kill()
        if pid_file.exists() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
