"""Output sets: every file of one run appears together, or none of them does; nothing else is touched.

`check_output_dir` refuses, before any work starts, an output folder that is a file, lies on a
virtual file system (/proc, /sys, /dev, ...) or cannot be written; `check_members` refuses a member
that exists as the wrong kind (a folder where the run writes a file, a file where it writes a folder).
`output_set` stages the whole set (files, and folders such as `figures/`) in a hidden temporary folder
inside the output folder; when the body finishes, the files it replaces are moved aside and the new
ones moved in with SIGINT/SIGTERM held off, so an interrupted or failed run leaves the previous set
intact (or no set), never new files beside old ones.

Only files are ever replaced or removed, never a folder. A folder member (`figures/`) is merged file
by file: a file there that this run does not write is removed only when a previous run of the suite
wrote it, as recorded in the folder's manifest (`MANIFEST`, written with each set); a user's own
file survives. A file member that this run does not write (an old `claims.pdf` beside a new
`claims.json`) is removed when `owned` says it came from an earlier run (by default: it is in the
manifest). Two runs swapping sets into one folder take turns (an `fcntl` lock on the folder). A
write error such as a full disk becomes one `UserInputError` line naming the folder.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from ntkm import interrupts
from ntkm.errors import UserInputError
from ntkm.io import atomic_write_text, parse_json, read_regular

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


#: The suite's installed packages: no output set may land inside them (their files are the program).
PACKAGES = ("ntkm", "theory", "empirics", "verify", "reports")


def package_folders() -> list[Path]:
    """The real folders of the installed packages (side by side, wherever they are installed)."""
    base = Path(__file__).resolve().parents[1]
    return [Path(os.path.realpath(base / name)) for name in PACKAGES if (base / name / "__init__.py").is_file()]


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or path.is_relative_to(folder)


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_output_dir(folder: str | Path, option: str = "--out", manifest: bool = False) -> Path:
    """The absolute output folder, after checking that a set can be written there (one-line errors).

    The folder may not exist yet (it is created when the set is written), but its nearest existing
    ancestor must then be a writable folder. It may not lie inside the suite's installed packages. With
    `manifest`, the folder's manifest is read and checked too (`read_manifest`), before any work.
    """
    p = Path(folder).expanduser().absolute()
    real = Path(os.path.realpath(p))
    kind = _mount_type(_existing_ancestor(real))
    if any(str(real) == r or str(real).startswith(r + "/") for r in VIRTUAL_ROOTS) or kind in VIRTUAL_FS:
        raise UserInputError(f"{option} {p} is on a virtual file system ({kind or real.parts[1]}), not storage; "
                             "give a folder on a disk")
    pkg = next((f for f in package_folders() if _inside(real, f)), None)
    if pkg is not None:
        raise UserInputError(f"{option} {p} is inside the suite's installed package {pkg}; its files are the program "
                             "and are never overwritten: give a folder outside it")
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
    if manifest and p.is_dir():
        read_manifest(p)
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


#: The file, in an output folder, listing the files the suite's output sets wrote there (relative paths).
MANIFEST = ".ntkm-manifest.json"
MANIFEST_FORMAT = "ntk-malleability-suite/outputs"
#: The largest manifest read (bytes): a list of file names.
MANIFEST_BYTES = 16 << 20


def check_members(folder: Path, files: Iterable[str] = (), folders: Iterable[str] = (),
                  option: str = "--out") -> None:
    """Refuse (one line, before any work) a member that exists as the wrong kind: a folder (or a link to one)
    where the run writes a file, or anything but a folder where it writes a folder; and a name longer than the
    file system takes (255 bytes on most), which would fail only when the set is written."""
    files, folders = tuple(files), tuple(folders)
    try:
        name_max = os.pathconf(_existing_ancestor(Path(folder).absolute()), "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    for name in (*files, *folders):
        long = next((part for part in Path(name).parts if len(os.fsencode(part)) > name_max), None)
        if long is not None:
            raise UserInputError(f"{option}: the output name {long[:40]}... is {len(os.fsencode(long))} bytes long, "
                                 f"more than the {name_max} a file name may have here; give a shorter --out")
    for name in files:
        p = folder / name
        if p.is_dir():
            raise UserInputError(f"{option}: {p} is a folder, but this run writes a file there; move or rename the "
                                 "folder (it is left alone), or choose another --out")
    for name in folders:
        p = folder / name
        if os.path.lexists(p) and not p.is_dir():
            raise UserInputError(f"{option}: {p} is a file, but this run writes a folder there; move or rename the "
                                 "file (it is left alone), or choose another --out")


def read_manifest(folder: Path) -> set[str]:
    """The relative paths an earlier set recorded as written in `folder` (empty when absent or unreadable:
    then nothing counts as the suite's).

    The manifest is input like any other file: a named pipe or device there, or a listed path that is not a
    plain relative path resolving inside `folder` (`figures/../../victim.txt`, an absolute path, a path through
    a link that leads out), is refused in one line (`UserInputError`) before anything is moved or removed."""
    where = folder / MANIFEST
    if not os.path.lexists(where):
        return set()
    try:
        doc = parse_json(read_regular(where, MANIFEST_BYTES, "the output manifest"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return set()
    files = doc.get("files") if isinstance(doc, dict) and doc.get("format") == MANIFEST_FORMAT else None
    listed = {f for f in files if isinstance(f, str)} if isinstance(files, list) else set()
    for rel in sorted(listed):
        check_confined(folder, rel, f"{where} lists")
    return listed


def check_confined(folder: Path, rel: str, source: str, fix: str = "") -> Path:
    """`folder / rel`, after checking that `rel` (a path read from a file) is a plain relative path that resolves
    inside `folder` (links followed); anything else is one `UserInputError` line, and nothing is touched."""
    parts = Path(rel).parts
    bad = (rel in ("", ".") or "\0" in rel or Path(rel).is_absolute() or ".." in parts or rel != Path(rel).as_posix()
           or len(rel) > 4096)
    target = folder / rel
    if not bad:
        base = Path(os.path.realpath(folder))
        bad = not _inside(Path(os.path.realpath(target)), base) or target.parent.resolve() != (base / rel).parent
    if bad:
        fix = fix or f"remove {folder / MANIFEST} if it was edited, then rerun"
        raise UserInputError(f"{source} {rel[:200]!r}, which is not a file inside {folder}; nothing was moved or "
                             f"removed ({fix})")
    return target


class OutputSet:
    """A staged output set: write each member to `path(name)`; `final(path)` is where it will land."""

    def __init__(self, folder: Path, members: Iterable[str], staging: Path,
                 owned: Callable[[Path], bool] | None = None, folders: Iterable[str] = (), manifest: bool = True):
        self.folder = folder
        self.members = tuple(members)
        self.folders = tuple(folders)
        self.manifest = manifest
        self._listed = read_manifest(folder) if manifest else set()
        self.owned = owned or (lambda path: path.relative_to(self.folder).as_posix() in self._listed)
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

    def _plan(self) -> tuple[list[str], list[str]]:
        """(files to move in, files to remove), as paths relative to the folder; refuses a wrong-kind member."""
        files = [n for n in self.members if n not in self.folders]
        check_members(self.folder, [n for n in files if os.path.lexists(self.dir / n)], self.folders)
        new = [n for n in files if os.path.lexists(self.dir / n)]
        old = [n for n in files if n not in new and os.path.lexists(self.folder / n)
               and not (self.folder / n).is_dir() and self.owned(self.folder / n)]
        for name in self.folders:
            staged = self.dir / name
            inside = sorted(p.relative_to(self.dir).as_posix() for p in staged.rglob("*")
                            if not p.is_dir()) if staged.is_dir() else []
            check_members(self.folder, inside)
            new += inside
            old += sorted(r for r in self._listed if r.startswith(name + "/") and r not in inside
                          and os.path.lexists(self.folder / r) and not (self.folder / r).is_dir())
        for rel in (*new, *old):  # a link (figures -> elsewhere) must not carry a file out of the folder
            check_confined(self.folder, rel, "the output set would move", "replace the link by a folder")
        return new, old

    def commit(self) -> list[Path]:
        """Move the replaced and stale files aside and the new ones in (signals held); returns the new paths."""
        self._aside.mkdir()
        moves: list[tuple[Path, Path]] = []
        made: list[Path] = []

        def move(src: Path, dst: Path) -> None:
            for d in reversed(dst.parents):
                if not d.exists() and d.is_relative_to(self.folder):
                    d.mkdir()
                    made.append(d)
            os.replace(src, dst)
            moves.append((src, dst))

        with _signals_held(), _folder_lock(self.folder):
            new, old = self._plan()
            try:
                for rel in [*old, *(r for r in new if os.path.lexists(self.folder / r))]:
                    move(self.folder / rel, self._aside / rel)
                for rel in new:
                    move(self.dir / rel, self.folder / rel)
                if self.manifest:
                    self._write_manifest(new, old)
            except OSError as exc:
                for src, dst in reversed(moves):
                    os.replace(dst, src)
                for d in reversed(made):
                    with contextlib.suppress(OSError):
                        d.rmdir()
                raise disk_error(exc, self.folder) from None
            for name in self.folders:
                if any(r.startswith(name + "/") for r in old):
                    with contextlib.suppress(OSError):
                        (self.folder / name).rmdir()  # only when the stale files were all it held
        self.written = [self.folder / n for n in self.members
                        if n in new or (n in self.folders and any(r.startswith(n + "/") for r in new))]
        return list(self.written)

    def _write_manifest(self, new: list[str], old: list[str]) -> None:
        """Record this set's files beside those earlier sets wrote and that are still there."""
        keep = {r for r in self._listed if r not in old and os.path.lexists(self.folder / r)}
        doc = {"format": MANIFEST_FORMAT, "files": sorted(keep | set(new)),
               "note": "files written by the ntk-malleability suite; only these are ever replaced or removed"}
        atomic_write_text(self.folder / MANIFEST, json.dumps(doc, indent=1) + "\n")


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
               owned: Callable[[Path], bool] | None = None, folders: Iterable[str] = (),
               manifest: bool = True) -> Iterator[OutputSet]:
    """Stage an output set in `folder` and swap it in when the body succeeds (see the module docstring).

    `folders` names the members that are folders (merged file by file). `owned(path)` says whether an
    existing file member that this run does not rewrite belongs to an earlier set (and is removed); by
    default those the manifest lists do. `manifest=False` writes no manifest (then `owned` decides alone,
    and no file inside a folder member counts as the suite's).

    On an exception or interrupt in the body, the staging folder is deleted and the previous set is
    untouched; a folder this call created is removed again if it stays empty. OSErrors (a full disk)
    become one `UserInputError` line.
    """
    out = check_output_dir(folder, option, manifest)
    members = tuple(members)
    check_members(out, [m for m in members if m not in folders], folders, option)
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".outputs-", dir=out))
    except OSError as exc:
        raise disk_error(exc, out) from None
    try:
        try:
            s = OutputSet(out, members, staging, owned, folders, manifest)
            yield s
        except OSError as exc:
            raise disk_error(exc, out) from None
        interrupts.checkpoint()  # a signal a finalizer swallowed still keeps the new set out
        s.commit()
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()
