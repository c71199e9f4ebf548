"""Capture and restore every random number generator a training step can draw from.

Python's ``random``, NumPy's global generator, torch's CPU generator and, when CUDA is
already in use, each CUDA device's generator. CUDA is never initialised just to read its
state: a process that has not touched the GPU has no CUDA randomness to preserve.

:func:`capture` runs at every optimizer-step boundary of a run using CUDA (the state a
CUDA OOM falls back to), so it only copies: the generators' states are kept as the
objects their libraries hand out (Python's tuple, NumPy's key array, torch's byte
tensors), never walked into lists.
:func:`storable` turns a captured state into the form a snapshot holds, the two 624-word
Mersenne Twister keys as int64 tensors (stored as blobs, not as 1,249 JSON numbers), and
only when a snapshot is taken. :func:`restore` and :func:`check` accept that form, the
captured one, and the lists older snapshots hold.
:func:`derive_seed` names a stable seed for any parts: the sampler's permutations, the
loader's generator and each rank's generators all draw from seeds it derives.
"""

from __future__ import annotations

import array
import ctypes
import hashlib
import random
import struct
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch

from burst.errors import SnapshotError


def derive_seed(*parts: object, bits: int = 32) -> int:
    """A stable seed from any parts (hash-based: no correlation between nearby inputs)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") % (1 << bits)


def capture() -> dict[str, Any]:
    """The generators' states now (copies: later draws do not change them)."""
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": [np_kind, np_keys, int(np_pos), int(np_has_gauss), float(np_gauss)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


class Boundary:
    """:func:`capture` for every step boundary, without re-reading unchanged Mersenne
    Twister keys.

    Reading a generator's 624-word key is the costly part of a capture (NumPy copies it
    word by word into a new array; Python's ``getstate`` builds a tuple of 625 ints, 12 us
    of a 20 us capture), and most training loops draw from neither global generator
    between two steps. Each generator's raw state (key and position, read as bytes) is
    compared with what it was at the last full read; when equal, that read's result still
    holds. The raw bytes are read before the full state, so a draw from another thread in
    between can only cause one needless re-read, never a stale result. Cached Gaussians
    live outside the raw states: Python's ``gauss_next`` is read every time, and a NumPy
    read that found one cached is never reused (using it up does not move the key).
    """

    def __init__(self) -> None:
        self._numpy_view, self._python_view = _RawView(_numpy_address), _RawView(_python_address)
        self._raw: bytes | None = None
        self._numpy: list[Any] | None = None
        self._python_raw: bytes | None = None
        self._python: tuple[Any, Any] | None = None  # (version, internal state)

    def capture(self) -> dict[str, Any]:
        state: dict[str, Any] = {"python": self._python_state(),
                                 "numpy": self._numpy_state(), "torch": torch.get_rng_state()}
        if torch.cuda.is_initialized():  # implies available; asking that costs 5 us a step
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def _python_state(self) -> tuple[Any, Any, Any]:
        generator = getattr(random.getstate, "__self__", None)  # the module's hidden instance
        raw = self._python_view.read(generator)
        if generator is not None and raw is not None and raw == self._python_raw \
                and self._python is not None:
            version, internal = self._python
            return version, internal, generator.gauss_next
        state = random.getstate()
        self._python_raw, self._python = (raw, state[:2]) if raw is not None else (None, None)
        return state

    def _numpy_state(self) -> list[Any]:
        get = getattr(np.random, "get_bit_generator", None)  # NumPy >= 1.25
        raw = self._numpy_view.read(get() if get is not None else None)
        if raw is not None and raw == self._raw and self._numpy is not None:
            return self._numpy
        kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
        state = [kind, keys, int(pos), int(has_gauss), float(gauss)]
        self._raw, self._numpy = (raw, state) if raw is not None and not has_gauss else (None,
                                                                                         None)
        return state


class Fingerprint:
    """Whether any global generator moved between two moments, for a few microseconds.

    A run marks the generators when a step ends and asks at the next step's start whether
    anything drew in between (:mod:`burst.training.batches` says why that matters). Python's
    and NumPy's raw states are read in place as bytes (see :class:`Boundary`), torch's CPU
    state is its 5 KB byte tensor; CUDA's are read only once CUDA is in use. Nothing is
    walked or converted: a mark is a handful of copies, a check as many comparisons."""

    def __init__(self) -> None:
        self._numpy_view, self._python_view = _RawView(_numpy_address), _RawView(_python_address)
        self._marked: tuple[Any, ...] | None = None

    def mark(self) -> None:
        self._marked = self._read()

    def moved(self) -> bool:
        """Whether a generator drew since :meth:`mark` (False before any mark)."""
        if self._marked is None:
            return False
        now = self._read()
        return any(not _same(a, b) for a, b in zip(self._marked, now, strict=True))

    def _read(self) -> tuple[Any, ...]:
        python = self._python_view.read(getattr(random.getstate, "__self__", None))
        get = getattr(np.random, "get_bit_generator", None)
        numpy = self._numpy_view.read(get() if get is not None else None)
        return (python if python is not None else random.getstate(),
                numpy if numpy is not None else _numpy_bytes(),
                torch.get_rng_state(),
                torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [])


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, list) and a and isinstance(a[0], torch.Tensor):
        return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _numpy_bytes() -> tuple[Any, ...]:
    """NumPy's global state where its raw view cannot be read, comparable with ``==``."""
    # the global generator is always MT19937, for which legacy=True gives the tuple
    state = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state(legacy=True))
    kind, keys, pos, has_gauss, gauss = state
    return kind, keys.tobytes(), int(pos), int(has_gauss), float(gauss)


def seeded(value: int) -> dict[str, Any]:
    """Fresh generator states from one seed (Python, NumPy, torch CPU), built without
    touching the live generators; CUDA is left to whoever uses the state."""
    kind, keys, pos, has_gauss, gauss = np.random.RandomState(value % (1 << 32)).get_state()
    return {
        "python": random.Random(value).getstate(),
        "numpy": [kind, keys, int(pos), int(has_gauss), float(gauss)],
        "torch": torch.Generator().manual_seed(value).get_state(),
    }


_RAW_FORMAT = "i624I"  # CPython's RandomObject after its header: int index, uint32 key[624]
_RAW_BYTES = 624 * 4 + 4  # the same size as NumPy's MT19937 state: uint32 key[624], int pos


class _RawView:
    """One generator's raw state, read as bytes in place.

    The ctypes view is made once per generator object (``locate`` finds its address, or
    None where it cannot be read), so a read is a 0.1 us copy of 2.5 KB. The view keeps a
    reference to that object: its memory cannot be freed or reused under the view."""

    def __init__(self, locate: Callable[[Any], int | None]) -> None:
        self._locate = locate
        self._owner: object | None = None
        self._view: ctypes.Array[ctypes.c_char] | None = None

    def read(self, owner: object | None) -> bytes | None:
        if owner is None:
            return None
        if owner is not self._owner:
            address = self._locate(owner)
            self._owner = owner
            self._view = None if address is None else (ctypes.c_char * _RAW_BYTES
                                                       ).from_address(address)
        return None if self._view is None else self._view.raw


def _python_address(generator: object) -> int | None:
    """Where a ``random.Random``'s ``index`` and ``state[624]`` start, once checked against
    its ``getstate`` (an ``id`` that is not an address, another header size or field
    order all fail the check; burst then calls ``getstate`` every time)."""
    if not isinstance(generator, random.Random):
        return None
    address = id(generator) + object.__basicsize__
    index, *key = struct.unpack(_RAW_FORMAT, ctypes.string_at(address, _RAW_BYTES))
    return address if (*key, index) == generator.getstate()[1] else None


def _numpy_address(generator: object) -> int | None:
    """Where a NumPy MT19937 bit generator's state is (its public ``ctypes`` interface)."""
    if type(generator).__name__ != "MT19937":
        return None
    return int(generator.ctypes.state_address)  # type: ignore[attr-defined]  # an MT19937, by its name


def storable(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with both Mersenne Twister keys as int64 tensors, ready for a snapshot's
    tensor table (one C-level conversion each; keys already tensors are kept)."""
    version, internal, gauss = state["python"]
    kind, keys, pos, has_gauss, np_gauss = state["numpy"]
    out = dict(state)
    out["python"] = (version, _int64_tensor(internal), gauss)
    out["numpy"] = [kind, _int64_tensor(keys), pos, has_gauss, np_gauss]
    return out


def as_lists(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with both keys as lists of ints (JSON-able, as snapshots before tensor
    keys held them); the torch and CUDA states stay tensors."""
    version, internal, gauss = state["python"]
    kind, keys, pos, has_gauss, np_gauss = state["numpy"]
    out = dict(state)
    out["python"] = (version, tuple(_ints(internal)), gauss)
    out["numpy"] = [kind, _ints(keys), pos, has_gauss, np_gauss]
    return out


def restore(state: dict[str, Any]) -> list[str]:
    """Apply ``state``; return notes on anything that could not be restored exactly."""
    notes: list[str] = []
    random.setstate(_python_state(state["python"]))
    np.random.set_state(_numpy_state(state["numpy"]))
    torch.set_rng_state(state["torch"].clone())
    notes.extend(_restore_cuda(state.get("cuda")))
    return notes


def check(state: Any) -> None:
    """Raise ``SnapshotError`` unless ``state`` is what :func:`capture` makes.

    Tried on throwaway generators, so a restore can refuse a malformed snapshot before it
    has changed anything (the model and optimizer are loaded before the RNGs).
    """
    try:
        random.Random().setstate(_python_state(state["python"]))
        np.random.RandomState().set_state(_numpy_state(state["numpy"]))
        torch.Generator().set_state(state["torch"].clone())  # a view into a blob: copy
        cuda = state.get("cuda") or []
        if not isinstance(cuda, list) or not all(isinstance(s, torch.Tensor) for s in cuda):
            raise TypeError("cuda states are not tensors")
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError, OverflowError) as exc:
        raise SnapshotError(f"the snapshot's RNG state is malformed ({exc})") from None


def _int64_tensor(words: Any) -> torch.Tensor:
    if isinstance(words, torch.Tensor):
        return words.to(torch.int64)
    if isinstance(words, np.ndarray):
        return torch.from_numpy(words.astype(np.int64))
    return torch.frombuffer(array.array("q", words), dtype=torch.int64)


def _ints(words: Any) -> list[int]:
    if isinstance(words, torch.Tensor | np.ndarray):
        return words.tolist()
    return [int(w) for w in words]


def _python_state(value: Any) -> tuple:
    version, internal, gauss = value
    if isinstance(internal, torch.Tensor):
        if internal.dim() != 1:
            raise ValueError("the Python generator's key is not a vector")
        internal = internal.tolist()
    return (version, tuple(internal), gauss)


def _numpy_state(value: Any) -> tuple:
    kind, keys, pos, has_gauss, gauss = value
    if isinstance(keys, torch.Tensor):
        keys = keys.numpy()
    words = np.asarray(keys)
    if words.ndim != 1 or (words.size and (words.min() < 0 or words.max() > 0xFFFFFFFF)):
        raise ValueError("the NumPy generator's key is not 32-bit words")
    return (kind, words.astype(np.uint32), pos, has_gauss, gauss)


def _restore_cuda(saved: list[torch.Tensor] | None) -> list[str]:
    if not saved:
        return []
    if not torch.cuda.is_available():
        return [f"CUDA RNG state of {len(saved)} device(s) not restored: no CUDA here"]
    count = torch.cuda.device_count()
    if count == len(saved):
        torch.cuda.set_rng_state_all([s.clone() for s in saved])
        return []
    for device in range(min(count, len(saved))):
        torch.cuda.set_rng_state(saved[device].clone(), device)
    return [f"CUDA RNG restored for {min(count, len(saved))} of {len(saved)} saved device(s) "
            f"({count} present)"]
