"""ResumableSampler and SeededDataset: the data order and per-sample randomness replay."""

from __future__ import annotations

import pickle
import random

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from burst import ResumableSampler, SampleIndex, SeededDataset


def test_order_is_a_pure_function_of_seed_and_epoch():
    a, b = ResumableSampler(50, seed=1), ResumableSampler(50, seed=1)
    b.set_epoch(3)
    list(b)  # drawing an epoch leaves no state behind
    assert a.order(3).tolist() == b.order(3).tolist()
    assert a.order(3).tolist() != a.order(4).tolist()
    assert sorted(a.order(3).tolist()) == list(range(50))


def test_start_skips_exactly_the_consumed_samples():
    sampler = ResumableSampler(20, seed=5)
    sampler.set_epoch(2)
    full = list(sampler)
    sampler.set_epoch(2, start=7)
    assert list(sampler) == full[7:]
    assert len(sampler) == 13


def test_drop_last_keeps_only_whole_global_batches():
    sampler = ResumableSampler(100, seed=0, drop_last=True)
    sampler.global_batch = 16
    assert len(sampler) == 96
    sampler.global_batch = None
    assert len(sampler) == 100


def test_no_shuffle_is_sequential():
    sampler = ResumableSampler(5, shuffle=False)
    assert list(sampler) == [0, 1, 2, 3, 4]


def test_sample_index_carries_its_epoch_through_pickle():
    index = pickle.loads(pickle.dumps(SampleIndex(7, epoch=3)))
    assert index == 7 and index.epoch == 3 and [10, 11, 12, 13, 14, 15, 16, 17][index] == 17


class Noisy(Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i):
        return torch.rand(2), random.random(), np.random.rand()


def test_seeded_dataset_replays_a_samples_randomness_whatever_was_drawn_before():
    data = SeededDataset(Noisy(), seed=1)
    first = data[SampleIndex(4, epoch=1)]
    torch.rand(100)
    random.random()
    again = data[SampleIndex(4, epoch=1)]
    assert torch.equal(first[0], again[0]) and first[1:] == again[1:]
    other_epoch = data[SampleIndex(4, epoch=2)]
    assert not torch.equal(first[0], other_epoch[0])


def test_seeded_dataset_leaves_the_callers_generators_untouched():
    data = SeededDataset(Noisy(), seed=1)
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    data[SampleIndex(1, epoch=0)]
    assert torch.equal(torch.rand(3), expected[0])
    assert (random.random(), np.random.rand()) == expected[1:]


def test_worker_count_does_not_change_what_a_sample_gets():
    data = SeededDataset(Noisy(), seed=2)
    sampler = ResumableSampler(data, seed=0)
    sampler.set_epoch(1, start=3)
    inline = [b[0] for b in DataLoader(data, batch_size=2, sampler=sampler, num_workers=0)]
    workers = [b[0] for b in DataLoader(data, batch_size=2, sampler=sampler, num_workers=2)]
    assert all(torch.equal(a, b) for a, b in zip(inline, workers, strict=True))


def test_indices_over_a_seeded_dataset_carry_their_epoch_through_workers():
    sampler = ResumableSampler(SeededDataset(Noisy(), seed=2), seed=0)
    sampler.set_epoch(4)
    indices = pickle.loads(pickle.dumps(list(sampler)))  # as a worker receives them
    assert sorted(indices) == list(range(10)) and {i.epoch for i in indices} == {4}


def test_indices_over_any_other_dataset_are_plain_ints():
    sampler = ResumableSampler(Noisy(), seed=0)
    assert {type(i) for i in sampler} == {int}


def test_a_sampler_given_only_a_length_tags_epochs_since_it_cannot_tell():
    sampler = ResumableSampler(10, seed=0)
    sampler.set_epoch(2)
    assert {i.epoch for i in sampler} == {2}


def test_the_run_tags_epochs_when_the_loader_seeds_a_dataset_the_sampler_never_saw(tmp_path):
    import burst

    raw = Noisy()
    sampler = ResumableSampler(raw, seed=0)  # built over the raw data, loaded through a wrapper
    loader = DataLoader(SeededDataset(raw, seed=1), batch_size=2, sampler=sampler)
    model = torch.nn.Linear(2, 1)
    run = burst.Run("tagged", store=str(tmp_path / "store"), global_batch=2, micro_batch=2)
    run.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    next(iter(run.steps(loader)))
    assert {i.epoch for i in sampler} == {0}
    run.close()


def test_a_frameworks_loop_tags_epochs_when_its_loader_seeds_a_dataset_the_sampler_never_saw(
        tmp_path):
    import burst
    from burst.integrations.loop import ForeignLoop

    raw = Noisy()
    sampler = ResumableSampler(raw, seed=0)  # as a Lightning or Accelerate user builds it
    loader = DataLoader(SeededDataset(raw, seed=1), batch_size=2, sampler=sampler)
    model = torch.nn.Linear(2, 1)
    run = burst.Run("tagged", store=str(tmp_path / "store"), global_batch=2, micro_batch=2)
    run.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loop = ForeignLoop(run)
    loop.use_sampler(sampler)
    loop.position(loader)
    assert {i.epoch for i in sampler} == {0}
    run.close()
