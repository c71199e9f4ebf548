"""An exact, resumable data order, and per-sample randomness that replays.

``ResumableSampler`` draws one permutation per epoch from ``(seed, epoch)`` alone, so the
order never depends on how far an iterator got or on the process that drew it, and it
can start anywhere: the run tells it how many samples of the epoch the optimizer has
already consumed (not how many the DataLoader prefetched) and it yields from the next.

The permutation uses NumPy's legacy ``RandomState``, whose stream NumPy has frozen, so a
run resumed on another machine with other library versions sees the same order.

``SeededDataset`` makes augmentation randomness a function of (seed, epoch, sample):
each ``__getitem__`` runs under generators seeded for that sample and the caller's
generators are left untouched. Which worker loads a sample, how many workers there are,
and whether the run was resumed in between no longer matter. With DataLoader workers it is
*required* for exact replay of any randomness in ``__getitem__``: each worker otherwise
draws from its own generator, and after a mid-epoch resume the samples land on other
workers, at other points of their streams.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator, Sized
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler, get_worker_info

from burst.parallel import partition
from burst.state.rng import derive_seed


class SampleIndex(int):
    """A dataset index that also carries its epoch; behaves exactly like an ``int``."""

    epoch: int

    def __new__(cls, index: int, epoch: int) -> SampleIndex:
        value = super().__new__(cls, index)
        value.epoch = epoch
        return value

    def __reduce__(self) -> tuple:  # keep the epoch when sent to DataLoader workers
        return (SampleIndex, (int(self), self.epoch))


@functools.lru_cache(maxsize=64)
def _epoch_indices(epoch: int) -> type[SampleIndex]:
    """A ``SampleIndex`` class whose instances all carry ``epoch`` as a class attribute,
    built by ``int``'s own constructor: the sampler makes one index per sample, and this
    takes a third of the time of ``SampleIndex(index, epoch)``."""
    return type("SampleIndex", (SampleIndex,), {"__slots__": (), "__new__": int.__new__,
                                                 "epoch": epoch})


class ResumableSampler(Sampler[int]):
    """Seeded shuffle per epoch that starts at any sample position.

    ``drop_last`` drops the epoch's tail that would not fill a whole global batch (set by
    the run through ``global_batch``), so every optimizer step sees a full batch whatever
    the micro-batch split: use this one. The DataLoader's own ``drop_last`` drops per
    micro-batch, so the epoch's last step changes when a resume re-plans the micro-batch,
    and it is refused on several ranks.

    Pass it to ``Run.attach(..., sampler=...)`` so a snapshot of other data (length, seed,
    shuffle, ``drop_last``) is refused before anything is restored.

    On several ranks (``rank``/``world_size``, set by the run) each rank yields only its
    contiguous share of every global batch (:mod:`burst.partition`), so the ranks together
    consume exactly the single-rank order, step by step.
    """

    def __init__(self, data: Sized | int, *, seed: int = 0, shuffle: bool = True,
                 drop_last: bool = False) -> None:
        self.num_samples = data if isinstance(data, int) else len(data)
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last
        self.global_batch: int | None = None
        self.rank, self.world_size = 0, 1
        self.epoch = 0
        self.start = 0
        # A SeededDataset needs each index to carry its epoch (a DataLoader worker gets
        # nothing else); any other dataset gets plain ints, which index it faster. Given
        # only a length, the sampler cannot tell, so it tags. ``Run.steps`` turns tagging
        # on when the loader's own dataset is a SeededDataset.
        self.tag_epochs = not isinstance(data, Dataset) or isinstance(data, SeededDataset)

    def follow(self, loader: object) -> None:
        """Tag indices with their epoch when ``loader``'s dataset is a SeededDataset: it
        may wrap the dataset this sampler was built over, which could not tell."""
        if isinstance(getattr(loader, "dataset", None), SeededDataset):
            self.tag_epochs = True

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Select the epoch's order and skip the first ``start`` samples of it."""
        self.epoch, self.start = epoch, start

    def epoch_length(self) -> int:
        if self.drop_last and self.global_batch:
            return self.num_samples // self.global_batch * self.global_batch
        return self.num_samples

    def order(self, epoch: int) -> np.ndarray:
        """The full sample order of ``epoch`` (a pure function of seed and epoch)."""
        if not self.shuffle:
            return np.arange(self.num_samples)
        state = np.random.RandomState(derive_seed("sampler", self.seed, epoch))
        return state.permutation(self.num_samples)

    def __iter__(self) -> Iterator[int]:
        order = self.order(self.epoch)[self.start : self.epoch_length()]
        if self.world_size > 1:
            order = order[partition.rank_positions(len(order), self._split_batch(),
                                                   self.rank, self.world_size)]
        if not self.tag_epochs:
            return iter(order.tolist())  # ints in one C call
        return map(_epoch_indices(self.epoch), order.tolist())

    def __len__(self) -> int:
        """This rank's samples left in the epoch."""
        if self.world_size > 1:
            return partition.rank_count(self.remaining(), self._split_batch(), self.rank,
                                        self.world_size)
        return self.remaining()

    def remaining(self) -> int:
        """Samples left in the epoch on all ranks together."""
        return max(self.epoch_length() - self.start, 0)

    def _split_batch(self) -> int:
        if not self.global_batch:
            raise ValueError("a sampler split across ranks needs the run's global batch")
        return self.global_batch

    def state(self) -> dict[str, Any]:
        return {"seed": self.seed, "shuffle": self.shuffle, "drop_last": self.drop_last,
                "num_samples": self.num_samples}


class SeededDataset(Dataset):
    """Wraps a dataset so each sample's randomness is seeded by (seed, epoch, index).

    Cheap per sample: the three global generators (Python's, NumPy's, torch's CPU one)
    are seeded in place for the sample, never forked. In the training process the
    caller's states are saved and put back around the sample; in a DataLoader worker
    they are not, since nothing a run replays draws from a worker's own generators (a
    worker's stream is not replayable after a resume anyway), and that skips the
    costliest part, reading NumPy's state.
    """

    def __init__(self, dataset: Dataset, seed: int = 0) -> None:
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]  # map-style: torch's Dataset type has no __len__

    def __getitem__(self, index: int) -> Any:
        epoch = getattr(index, "epoch", 0)
        sample_seed = derive_seed("sample", self.seed, epoch, int(index), bits=63)
        if get_worker_info() is not None:
            _seed_globals(sample_seed)
            return self.dataset[index]
        saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
        _seed_globals(sample_seed)
        try:
            return self.dataset[index]
        finally:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.set_rng_state(saved[2])


def _seed_globals(seed: int) -> None:
    """Seed Python's, NumPy's and torch's CPU generator for one sample (CUDA untouched:
    the same streams ``torch.random.fork_rng`` + ``manual_seed`` gave)."""
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
