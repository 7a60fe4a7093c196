"""The command's output set (``batch.npz``, ``metrics.json``, a plot inside the folder): staged, then published
at once.

Every file of a run is written into a staging folder beside the output folder (``.OUT.staging-*``). Only when
the whole set is written is it published:

- a new output folder: the staging folder is renamed to it (one atomic rename);
- an existing folder that holds only files: the other files are hard-linked into the staging folder, then the
  two folders are exchanged (``renameat2(RENAME_EXCHANGE)``, atomic) and the old one is removed, so a reader
  sees exactly the old set or exactly the new one at every moment. Where the exchange is not supported
  (not Linux, or a file system without it) two renames do it, rolled back on failure; a crash between them
  leaves the old set whole in the staging folder's place;
- an existing folder that holds sub-folders (or is the working directory) and no output set: the files are
  renamed into it one by one, removed again on failure (there was no old set to keep);
- a folder that is a mount point (a container volume, ``-v host:/out``): nothing can be renamed onto it or
  across it, so the staging folder is made inside it (``OUT/.staging-*``) and each file is renamed into place
  on its own: every file is replaced atomically (a reader sees each whole, old or new), but not the set as
  one (for a moment ``batch.npz`` can be new beside an old ``metrics.json``); a failure before publishing
  leaves an old set as it was.

A folder that already holds an output set is replaced only with ``--overwrite`` (``check_output_folder``,
before any input is read), and only when it can be exchanged whole. The rule holds again at publish time:
two runs publish one at a time (an exclusive ``flock`` on the output folder's parent, held from the check to
the rename), and without ``--overwrite`` a run that finds an output set there (another run's, published
while this one ran) writes nothing and fails naming the folder. On any failure or signal the staging
folder, and any parent folder the run created, are removed: a failed run leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import queue
import shutil
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from prm_jax.errors import OutputFolderError

OUTPUT_SET = ("batch.npz", "metrics.json")
# Errors of a full disk, a file-size limit, or a folder that refuses a rename (busy, on another device):
# the environment's, not a bug (one line, no traceback).
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EBUSY, errno.EXDEV})
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def current_umask() -> int:
    """The process's umask (read by setting it, then restoring it): files get the mode ``open`` would give."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def in_folder(path: Path, folder: Path) -> bool:
    """Whether ``path`` names a file directly inside ``folder`` (as given, or through symbolic links)."""
    return path.absolute().parent == folder.absolute() or path.parent.resolve() == folder.resolve()


def is_mount_point(folder: Path) -> bool:
    """Whether ``folder`` is a mount point (``os.path.ismount``, or, for a bind mount of a folder of the
    same file system, listed in ``/proc/self/mountinfo``): rename cannot replace it or move into it."""
    if not folder.is_dir():
        return False
    if os.path.ismount(folder):
        return True
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as table:
            points = {line.split()[4] for line in table if len(line.split()) > 4}
    except OSError:
        return False
    return str(folder.resolve()) in {point.encode().decode("unicode_escape") for point in points}


def _existing_set(folder: Path) -> list[str]:
    return [name for name in OUTPUT_SET if os.path.lexists(folder / name)]


def _exchangeable(folder: Path) -> bool:
    """A folder that can be swapped whole: only regular files in it, and not the working directory or
    one of its parents (a process must not be left standing in the removed old folder)."""
    cwd = Path.cwd().resolve()
    resolved = folder.resolve()
    if resolved == cwd or resolved in cwd.parents:
        return False
    return all(entry.is_file(follow_symlinks=False) for entry in os.scandir(folder))


def check_output_folder(flag: str, output: Path, overwrite: bool) -> None:
    """Everything about the output folder that would fail the run later, checked first."""
    if output.is_symlink() and not output.exists():
        raise OutputFolderError(f"{flag} {output}: is a dangling symbolic link")
    if output.exists() and not output.is_dir():
        raise OutputFolderError(f"{flag} {output}: exists and is not a directory")
    existing = output
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise OutputFolderError(f"{flag} {output}: {existing} is not a writable directory")
    if output.is_dir():
        old = _existing_set(output)
        if old and not overwrite:
            raise OutputFolderError(f"{flag} {output}: already holds an output set ({', '.join(old)}); pass "
                                    "--overwrite to replace it (the old set stays whole until the new one is "
                                    "complete), or choose another folder")
        if old and not _exchangeable(output) and not is_mount_point(output):
            raise OutputFolderError(f"{flag} {output}: --overwrite replaces an output set only in a folder that "
                                    "holds nothing but files (it is exchanged whole); this one holds folders or "
                                    "links, or is the working directory: choose another folder")
        if not os.access(output, os.W_OK | os.X_OK):
            raise OutputFolderError(f"{flag} {output}: is not a writable directory")


def _exchange(staging: Path, target: Path) -> None:
    """Swaps two folders atomically where the system can; else two renames (see the module docstring)."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        if renameat2(_AT_FDCWD, os.fsencode(staging), _AT_FDCWD, os.fsencode(target), _RENAME_EXCHANGE) == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise OSError(code, os.strerror(code), str(target))
    backup = staging.with_name(staging.name + ".old")
    os.rename(target, backup)
    try:
        os.rename(staging, target)
    except BaseException:
        os.rename(backup, target)
        raise
    os.rename(backup, staging)  # the old set where the caller removes it


class StagedOutputs:
    """A run's output files, written under ``path(name)`` and published together by ``publish``."""

    def __init__(self, output: Path, overwrite: bool = False, flag: str = "--output"):
        self.target = output.resolve() if output.is_symlink() else output.absolute()
        self.overwrite, self.flag = overwrite, flag
        self._created = [folder for folder in self.target.parents if not folder.exists()][::-1]
        self.target.parent.mkdir(parents=True, exist_ok=True)
        # A mount point's contents cannot be exchanged by rename: stage inside it (module docstring).
        self.inside = is_mount_point(self.target)
        where = (self.target, ".staging-") if self.inside else (self.target.parent, f".{self.target.name}.staging-")
        self.staging = Path(tempfile.mkdtemp(prefix=where[1], dir=where[0]))
        self.published = False  # the new set is in place (an interruption after this wrote it whole)

    def path(self, name: str) -> Path:
        return self.staging / name

    def holds(self, path: Path) -> bool:
        """Whether ``path`` belongs in the output folder (then it is staged with the set)."""
        return in_folder(path, self.target)

    @contextlib.contextmanager
    def _publishing(self):
        """One run publishes into the folder at a time: an exclusive lock on its parent (the output folder
        itself may not exist yet, or is exchanged), held from the last check to the rename."""
        try:
            fd = os.open(self.target.parent, os.O_RDONLY)
        except OSError:  # a parent that cannot be opened for reading: publish unlocked, as before
            yield
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:  # a file system without locks (some network mounts): the check below still runs
                pass
            yield
        finally:
            os.close(fd)  # releases the lock

    def publish(self) -> None:
        os.chmod(self.staging, 0o777 & ~current_umask())  # mkdtemp's 0700 otherwise
        with self._publishing():
            if not self.overwrite and (old := _existing_set(self.target)):
                raise OutputFolderError(
                    f"{self.flag} {self.target}: another run published an output set there ({', '.join(old)}) "
                    "while this one ran; nothing was written (pass --overwrite to replace it, or choose another "
                    "folder)")
            self._publish()

    def _publish(self) -> None:
        if self.inside:
            self._publish_file_by_file()
            return
        if not self.target.exists():
            os.rename(self.staging, self.target)
            self.published = True
            return
        if _exchangeable(self.target):
            for entry in os.scandir(self.target):  # the folder's other files stay in it
                if not os.path.lexists(self.staging / entry.name):
                    os.link(entry.path, self.staging / entry.name, follow_symlinks=False)
            _exchange(self.staging, self.target)
            self.published = True
            shutil.rmtree(self.staging, ignore_errors=True)  # the old set: the new one is in place whatever happens
            return
        if _existing_set(self.target):
            raise OutputFolderError(f"{self.target}: an output set appeared there during the run; nothing written")
        moved: list[Path] = []
        try:
            for name in sorted(os.listdir(self.staging)):
                os.rename(self.staging / name, self.target / name)
                moved.append(self.target / name)
        except BaseException:
            for path in moved:
                path.unlink(missing_ok=True)
            raise
        self.published = True
        self.staging.rmdir()

    def _publish_file_by_file(self) -> None:
        """Into a mount point: each file renamed over its old version (atomic per file), ``metrics.json``
        last, then the staging folder removed."""
        names = sorted(os.listdir(self.staging), key=lambda name: name == "metrics.json")
        for name in names:
            os.replace(self.staging / name, self.target / name)
        self.published = True
        self.staging.rmdir()

    def abort(self) -> None:
        """Removes everything this run created (the staging folder, and parent folders it made if empty)."""
        shutil.rmtree(self.staging, ignore_errors=True)
        for folder in reversed(self._created):
            with contextlib.suppress(OSError):
                folder.rmdir()


def write_npy(handle: Any, array: np.ndarray) -> None:
    """``np.lib.format.write_array``'s bytes, written from the array's own memory: for a file-like
    object that is not a real file (a zip member) numpy copies every 16 MB chunk twice before writing it."""
    if array.size and array.flags.c_contiguous and array.dtype.isnative and not array.dtype.hasobject:
        np.lib.format.write_array_header_1_0(handle, np.lib.format.header_data_from_array_1_0(array))
        handle.write(array.data.cast("B"))
    else:
        np.lib.format.write_array(handle, array, allow_pickle=False)


class BatchWriter:
    """``batch.npz`` begun early: a thread writes arrays into the staged file as they are handed over (the
    batch while the advantages are computed, then the timestep outputs while the summary is; file writes
    and XLA run without the GIL). ``abort`` stops it between two arrays; the file goes with the staging
    folder."""

    def __init__(self, path: Path):
        self.path = path
        self._handle = open(path, "wb")
        self._archive = zipfile.ZipFile(self._handle, "w", compression=zipfile.ZIP_STORED, allowZip64=True)
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._queue: queue.SimpleQueue[dict[str, np.ndarray] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def add(self, arrays: dict[str, np.ndarray]) -> None:
        """Queues arrays to be written after those handed over before them (as ``np.savez`` writes them)."""
        self._queue.put(dict(arrays))

    def _drain(self) -> None:
        try:
            while (arrays := self._queue.get()) is not None:
                for name, value in arrays.items():
                    if self._stop.is_set():
                        return
                    with self._archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                        write_npy(member, np.asanyarray(value))
        except BaseException as err:  # re-raised by finish
            self._error = err

    def finish(self) -> None:
        """Waits for every queued array, then closes the file."""
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        self._archive.close()
        self._handle.close()

    def abort(self) -> None:
        """Stops the thread after the array it is writing; closes the file whatever a full disk says."""
        self._stop.set()
        self._queue.put(None)
        self._thread.join()
        for close in (self._archive.close, self._handle.close):
            with contextlib.suppress(Exception):
                close()
