"""Each stream owner's secret for hash masks (`pep.core.masks`: `mmsi:hash`), on disk.

One key per owner: 32 random bytes, made the first time one of the owner's hash masks is
served, kept in `<dir>/<sha-256 of the owner, hex>.key` (mode 0600, the directory 0700; the
file name says nothing of the owner and cannot be steered by its name), and read back after a
restart, so that a consumer's hashed values stay the same across restarts and across the owner's
streams (and hashed attributes of two streams of one owner can be joined; of two owners, never).
The key reaches Spark only as data (a binary field of the plan table, or a one-row table a join
is crossed with): never in SQL text, a plan's text, a log line, explain or the audit trail.
Losing the directory changes every hashed value of every consumer from then on.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import threading
from pathlib import Path

KEY_BYTES = 32


class MaskKeys:
    """The owners' hash keys under one directory (see the module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()
        self._cache: dict[str, bytes] = {}

    def path_for(self, owner: str) -> Path:
        return self.directory / (hashlib.sha256(owner.encode("utf-8")).hexdigest() + ".key")

    def key_for(self, owner: str) -> bytes:
        """The owner's key, made (and kept) at its first use."""
        with self._lock:
            key = self._cache.get(owner)
            if key is None:
                key = self._load_or_make(owner)
                self._cache[owner] = key
            return key

    def _load_or_make(self, owner: str) -> bytes:
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        path = self.path_for(owner)
        try:
            return self._read(path)
        except FileNotFoundError:
            pass
        # written whole under a temporary name, then linked into place: a reader never sees a
        # partial key, and of two processes making one at once the first link wins
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_bytes(KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        return self._read(path)

    @staticmethod
    def _read(path: Path) -> bytes:
        data = path.read_bytes()
        if len(data) != KEY_BYTES:
            raise RuntimeError(f"an owner's hash key file is damaged ({len(data)} bytes, not "
                               f"{KEY_BYTES}); hashed values cannot be computed")
        return data


__all__ = ["MaskKeys", "KEY_BYTES"]
