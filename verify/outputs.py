"""Output sets: every file of one run appears together, or none of them does.

`check_output_dir` refuses, before any work starts, an output folder that is a file, lies on a
virtual file system (/proc, /sys, /dev, ...) or cannot be written. `output_set` stages the whole
set (files and folders such as `figures/`) in a hidden temporary folder inside the output folder;
when the body finishes, the previous set's members are moved aside and the new ones moved in with
SIGINT/SIGTERM held off, so an interrupted or failed run leaves the previous set intact (or no
set), never new files beside old ones. A member of the set that this run did not write is removed
(an old `claims.pdf` never stays beside a new `claims.json`) when `owned` says it came from an
earlier run. Two runs swapping sets into one folder take turns (an `fcntl` lock on the folder). A
write error such as a full disk becomes one `UserInputError` line naming the folder.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from ntkm.errors import UserInputError

#: File system types whose files are not real storage.
VIRTUAL_FS = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs",
                        "securityfs", "pstore", "bpf", "configfs", "fusectl", "mqueue", "hugetlbfs", "efivarfs",
                        "binfmt_misc", "autofs", "rpc_pipefs", "nsfs"})
VIRTUAL_ROOTS = ("/proc", "/sys", "/dev")


def _mount_type(path: Path) -> str | None:
    """The file system type of the mount holding `path` (from /proc/self/mounts; None if unknown)."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    best, kind = "", None
    text = str(path)
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = text == point or text.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, kind = point, parts[2]
    return kind


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_output_dir(folder: str | Path, option: str = "--out") -> Path:
    """The absolute output folder, after checking that a set can be written there (one-line errors).

    The folder may not exist yet (it is created when the set is written), but its nearest existing
    ancestor must then be a writable folder.
    """
    p = Path(folder).expanduser().absolute()
    real = Path(os.path.realpath(p))
    kind = _mount_type(_existing_ancestor(real))
    if any(str(real) == r or str(real).startswith(r + "/") for r in VIRTUAL_ROOTS) or kind in VIRTUAL_FS:
        raise UserInputError(f"{option} {p} is on a virtual file system ({kind or real.parts[1]}), not storage; "
                             "give a folder on a disk")
    if p.exists() and not p.is_dir():
        raise UserInputError(f"{option} {p} is a file, not a folder; give a folder (or remove the file)")
    base = _existing_ancestor(p)
    if not base.is_dir():
        raise UserInputError(f"{option} {p}: {base} is a file, not a folder; give another path")
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-check.", dir=base)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UserInputError(f"{option} {p}: cannot write in {base} ({exc.strerror or exc}); give a writable "
                             "folder") from None
    return p


def disk_error(exc: OSError, folder: Path) -> UserInputError:
    why = "the disk is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else (exc.strerror or str(exc))
    return UserInputError(f"could not write the outputs in {folder} ({why}); nothing was replaced: the previous "
                          "outputs there are unchanged; free space or choose another --out and rerun")


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait (and are delivered afterwards) while the set is swapped in."""
    sigs = {signal.SIGINT, signal.SIGTERM}
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    except (AttributeError, ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class OutputSet:
    """A staged output set: write each member to `path(name)`; `final(path)` is where it will land."""

    def __init__(self, folder: Path, members: Iterable[str], staging: Path,
                 owned: Callable[[Path], bool] | None = None):
        self.folder = folder
        self.members = tuple(members)
        self.owned = owned or (lambda path: True)
        self.dir = staging / "new"
        self.dir.mkdir()
        self._aside = staging / "old"
        self.written: list[Path] = []

    def path(self, name: str) -> Path:
        """Where to write member `name` now (inside the staging folder)."""
        if name not in self.members:
            raise ValueError(f"{name} is not a member of this output set ({', '.join(self.members)})")
        return self.dir / name

    def final(self, staged: str | Path) -> Path:
        """The final location of a staged path (or of a member name)."""
        p = Path(staged)
        return self.folder / (p.relative_to(self.dir) if p.is_absolute() else p)

    def commit(self) -> list[Path]:
        """Move the previous set aside and the new one in (signals held); returns the new final paths."""
        self._aside.mkdir()
        moved: list[str] = []
        stale = [n for n in self.members if os.path.lexists(self.folder / n)
                 and (os.path.lexists(self.dir / n) or self.owned(self.folder / n))]
        with _signals_held(), _folder_lock(self.folder):
            try:
                for name in stale:
                    os.replace(self.folder / name, self._aside / name)
                    moved.append(name)
                for name in self.members:
                    if os.path.lexists(self.dir / name):
                        os.replace(self.dir / name, self.folder / name)
                        self.written.append(self.folder / name)
            except OSError as exc:
                for p in self.written:
                    os.replace(p, self.dir / p.name)
                for name in moved:
                    os.replace(self._aside / name, self.folder / name)
                self.written = []
                raise disk_error(exc, self.folder) from None
        return list(self.written)


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """Two runs swapping sets into one folder take turns (an fcntl lock on the folder itself)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def output_set(folder: str | Path, members: Iterable[str], option: str = "--out",
               owned: Callable[[Path], bool] | None = None) -> Iterator[OutputSet]:
    """Stage an output set in `folder` and swap it in when the body succeeds (see the module docstring).

    `owned(path)` says whether an existing member that this run does not rewrite belongs to an earlier
    set (and is removed); by default every member does. Use it where a member's name could collide
    with a user's own file.

    On an exception or interrupt in the body, the staging folder is deleted and the previous set is
    untouched; a folder this call created is removed again if it stays empty. OSErrors (a full disk)
    become one `UserInputError` line.
    """
    out = check_output_dir(folder, option)
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".outputs-", dir=out))
    except OSError as exc:
        raise disk_error(exc, out) from None
    try:
        try:
            s = OutputSet(out, members, staging, owned)
            yield s
        except OSError as exc:
            raise disk_error(exc, out) from None
        s.commit()
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()
