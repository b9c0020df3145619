"""Issue 46, the CLI's second hardening pass: bounded reads, safe writes, one lock per ledger
file whatever name reaches it. The bad-input corpus (test_cli_corpus.py) runs each class
through `compass`; these pin the pieces underneath."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
import yaml

from compass.commands.common import MAX_YAML_NODES, parse_document, write_text
from compass.console import UsageError
from compass.evaluators.files import UnsafeFileError, read_regular, same_file, write_replacing
from compass.evaluators.ledger import LedgerBusyError, LedgerLock

# ---------------------------------------------------------------------------- reads


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(UnsafeFileError, match="FIFO"):
        read_regular(fifo, 1024)
    assert time.monotonic() - started < 5


def test_a_device_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsafeFileError, match="a device"):
        read_regular(Path("/dev/zero"), 1024)


def test_a_file_past_the_cap_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * 2048)
    with pytest.raises(UnsafeFileError, match="larger than"):
        read_regular(big, 1024)
    assert read_regular(big, 2048) == b"x" * 2048


def test_yaml_aliases_within_the_bound_still_load() -> None:
    """Anchors are ordinary YAML: a few shared blocks load as before."""
    text = "base: &b {k: [1, 2]}\none: *b\ntwo: *b\n"
    assert parse_document(text) == {
        "base": {"k": [1, 2]},
        "one": {"k": [1, 2]},
        "two": {"k": [1, 2]},
    }


def test_a_yaml_alias_bomb_is_refused_at_once() -> None:
    levels = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    started = time.monotonic()
    with pytest.raises(yaml.YAMLError, match=f"more than {MAX_YAML_NODES:,}"):
        parse_document("\n".join(levels))
    assert time.monotonic() - started < 5


def test_a_yaml_alias_cycle_is_refused() -> None:
    with pytest.raises(yaml.YAMLError, match="refers to the node that holds it"):
        parse_document("a: &a [1, *a]\n")


# ---------------------------------------------------------------------------- writes


def test_an_output_replaces_its_name_not_a_hard_links_file(tmp_path: Path) -> None:
    """Written by rename: another name of the old file keeps the old bytes."""
    output, other = tmp_path / "out.yaml", tmp_path / "other.yaml"
    output.write_text("old\n")
    os.link(output, other)
    write_replacing(output, "new\n")
    assert output.read_text() == "new\n"
    assert other.read_text() == "old\n"
    assert not same_file(output, other)


def test_an_output_through_a_symlink_is_refused(tmp_path: Path) -> None:
    target, link = tmp_path / "target", tmp_path / "link"
    target.write_text("keep\n")
    link.symlink_to(target)
    with pytest.raises(UsageError, match="is a symlink"):
        write_text(link, "new\n")
    assert target.read_text() == "keep\n"
    assert link.is_symlink()


def test_a_device_output_is_refused_and_kept(tmp_path: Path) -> None:
    """As root, a rename over /dev/full replaced the device node with a file."""
    node = tmp_path / "full"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    except PermissionError:
        os.mkfifo(node)
    kind = stat.S_IFMT(node.lstat().st_mode)
    with pytest.raises(UsageError, match="not a regular file"):
        write_text(node, "new\n")
    assert stat.S_IFMT(node.lstat().st_mode) == kind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]  # no temporary left


def test_hard_links_are_the_same_file(tmp_path: Path) -> None:
    first = tmp_path / "a"
    first.write_text("x")
    os.link(first, tmp_path / "b")
    assert same_file(first, tmp_path / "b")
    assert not same_file(first, tmp_path / "missing")


# ---------------------------------------------------------------------------- the ledger lock


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_two_names_of_one_ledger_share_its_lock(tmp_path: Path, link: str) -> None:
    """Two --resume runs through a link both took the lock and did every evaluation twice."""
    ledger, other = tmp_path / "run.jsonl", tmp_path / "other.jsonl"
    ledger.write_text("")
    if link == "symlink":
        other.symlink_to(ledger)
    else:
        os.link(ledger, other)
    first = LedgerLock(ledger)
    first.acquire()
    try:
        with pytest.raises(LedgerBusyError, match="in use by another search"):
            LedgerLock(other).acquire()
    finally:
        first.release()
    second = LedgerLock(other)
    second.acquire()  # free again once released
    second.release()


def test_a_new_ledger_is_locked_once_it_exists(tmp_path: Path) -> None:
    ledger = tmp_path / "new.jsonl"
    lock = LedgerLock(ledger)
    lock.acquire()  # no file yet: only the name is held
    try:
        ledger.write_text("")
        lock.hold_ledger()
        os.link(ledger, tmp_path / "alias.jsonl")
        with pytest.raises(LedgerBusyError):
            LedgerLock(tmp_path / "alias.jsonl").acquire()
    finally:
        lock.release()
