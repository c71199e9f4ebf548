"""An in-process store for unit tests: a dict, with the same key rules as every store."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from burst.store.base import Pace, check_key, check_range

_BUCKETS: dict[str, dict[str, bytes]] = {}
_LOCK = threading.Lock()


def reset() -> None:
    """Forget every bucket, so the next ``memory://name`` starts empty (tests call this
    between tests; a store opened before keeps its own, now detached, contents)."""
    with _LOCK:
        _BUCKETS.clear()


class MemoryStore:
    """``memory://name`` stores with the same name share their contents within a process."""

    def __init__(self, name: str = "default") -> None:
        self.url = f"memory://{name}"
        with _LOCK:
            self._objects = _BUCKETS.setdefault(name, {})

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        self._objects[check_key(key)] = bytes(data)

    def put_file(self, key: str, path: str | os.PathLike[str], pace: Pace | None = None
                 ) -> None:
        """The file's bytes, whole: this store keeps every object in memory anyway."""
        data = Path(path).read_bytes()
        if pace is not None:
            pace(len(data))
        self.put(key, data)

    def put_if_absent(self, key: str, data: bytes | bytearray | memoryview) -> bool:
        with _LOCK:
            if check_key(key) in self._objects:
                return False
            self._objects[key] = bytes(data)
            return True

    def get(self, key: str) -> bytes:
        return self._objects[check_key(key)]

    def read_into(self, key: str, buffer: memoryview) -> int:
        data = self.get(key)
        n = min(len(buffer), len(data))
        buffer[:n] = data[:n]
        return len(data)

    def read_range(self, key: str, start: int, length: int) -> bytes:
        data = self.get(key)
        check_range(self.url, key, start, length, len(data))
        return data[start : start + length]

    def size(self, key: str) -> int | None:
        data = self._objects.get(check_key(key))
        return None if data is None else len(data)

    def list(self, prefix: str) -> list[str]:
        return sorted(k for k in list(self._objects) if k.startswith(prefix))

    def delete(self, key: str) -> None:
        self._objects.pop(check_key(key), None)
