"""The POSIX shared-memory segment under the block pool: its file in /dev/shm, attached without
the resource tracker, and the file lock that guards the pool's header across processes."""

from __future__ import annotations

import fcntl
import os
import re
import sys
import threading
from collections.abc import Sized
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

SHM_DIR = "/dev/shm"  # where Linux keeps POSIX shared memory; the lock is taken on the file
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,200}")
_TRACKER_PATCH = threading.Lock()


def open_untracked(name: str) -> SharedMemory:
    """Attach to a segment without registering it with the resource tracker, which would unlink
    it when this process exits (Python 3.11 registers attached segments too). Spawned workers
    share their parent's tracker, so unregistering afterwards would drop the owner's own entry."""
    if sys.version_info >= (3, 13):
        return SharedMemory(name=name, track=False)  # type: ignore[call-arg]
    with _TRACKER_PATCH:
        register = resource_tracker.register

        def register_unless_shm(name: Sized, rtype: str) -> None:
            if rtype != "shared_memory":
                register(name, rtype)

        resource_tracker.register = register_unless_shm
        try:
            return SharedMemory(name=name)
        finally:
            resource_tracker.register = register


def segment_path(name: str) -> str:
    if not _NAME_RE.fullmatch(name):  # a plain file name in SHM_DIR
        raise ValueError(f"pool name {name!r}: use 1-200 of [A-Za-z0-9_.-]")
    return os.path.join(SHM_DIR, name)


class SegmentLock:
    """The pool header's lock: this process's threads first, then flock on the segment file."""

    def __init__(self, fd: int) -> None:
        self.fd, self._threads = fd, threading.Lock()

    def __enter__(self) -> None:
        self._threads.acquire()
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:  # a closed pool (EBADF): leave the thread lock free
            self._threads.release()
            raise

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        self._threads.release()
