"""Files the command line reads and writes, made safe against hostile paths."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

MiB = 1024 * 1024


class UnsafeFileError(OSError):
    """A path that cannot be read or written safely (an OSError, as a failed write is)."""

    def __init__(self, what: str, fix: str) -> None:
        super().__init__(f"{what}; {fix}")
        self.what, self.fix = what, fix


def _kind(mode: int) -> str:
    """What a non-regular file is, as a person would name it."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def describe_size(size: int) -> str:
    """A byte count as MiB (or bytes when small)."""
    return f"{size / MiB:,.1f} MiB" if size >= MiB else f"{size:,} bytes"


def read_regular(path: Path, limit: int) -> bytes:
    """A regular file's bytes (at most ``limit``), opened without blocking (a FIFO would hang)."""
    fd = None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFileError(f"{path} is {_kind(info.st_mode)}", "give a regular file")
        too_big = UnsafeFileError(
            f"{path} is larger than the {describe_size(limit)} compass reads",
            "give a smaller file",
        )
        if info.st_size > limit:
            raise too_big
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(MiB, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # it grew while being read
                raise too_big
        return b"".join(chunks)
    except UnsafeFileError:
        raise
    except FileNotFoundError:  # only the open: the rest reads its descriptor
        raise UnsafeFileError(f"{path}: no such file", "check the path") from None
    except OSError as exc:
        raise UnsafeFileError(
            f"{path}: cannot read it ({exc.strerror})", "check the path"
        ) from None
    finally:
        if fd is not None:
            os.close(fd)


def same_file(first: str | os.PathLike[str], second: str | os.PathLike[str]) -> bool:
    """Whether two paths name one file: the same device and inode, or the same resolved path."""
    with contextlib.suppress(OSError, ValueError):  # one of them does not exist (yet)
        if os.path.samefile(first, second):
            return True
    return Path(first).resolve() == Path(second).resolve()


def output_problem(path: Path) -> UnsafeFileError | None:
    """Why a path cannot take an output file (a symlink would land on its target), or None."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        return UnsafeFileError(f"{path}: cannot check it ({exc.strerror})", "choose another path")
    if info is not None:
        if stat.S_ISLNK(info.st_mode):
            return UnsafeFileError(
                f"{path} is a symlink (the output would replace what it points to)",
                "name the file itself, or another path",
            )
        if stat.S_ISDIR(info.st_mode):
            return UnsafeFileError(f"{path} is a directory", "name a file")
        if not stat.S_ISREG(info.st_mode):
            return UnsafeFileError(
                f"{path} is {_kind(info.st_mode)}, not a regular file", "name a regular file"
            )
    if not path.parent.is_dir():
        return UnsafeFileError(
            f"directory {path.parent} does not exist", "create it or choose another path"
        )
    return None


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path``, fsynced and renamed over it on success, else removed."""
    problem = output_problem(path)
    if problem is not None:
        raise problem
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    temporary = Path(name)
    try:
        yield temporary
        with open(temporary, "rb+") as handle:
            os.fsync(handle.fileno())
        # mkstemp makes the file private: an output gets the mode a new file would get.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        # Checked again just before the rename: what the path names may have changed.
        problem = output_problem(path)
        if problem is not None:
            raise problem
        os.replace(temporary, path)
        with contextlib.suppress(OSError):
            directory = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


def write_replacing(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (see replacing)."""
    with replacing(path) as temporary:
        temporary.write_text(text, encoding="utf-8")
