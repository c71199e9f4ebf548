"""Splitting global batches across ranks: the ranks together consume the single-rank order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from burst import ResumableSampler
from burst.errors import ConfigError
from burst.parallel import partition


@given(remaining=st.integers(0, 300), batch_per_rank=st.integers(1, 12),
       world=st.integers(1, 6))
def test_ranks_chunks_concatenate_to_the_single_rank_order_step_by_step(remaining,
                                                                       batch_per_rank, world):
    global_batch = batch_per_rank * world
    positions = [partition.rank_positions(remaining, global_batch, r, world).tolist()
                 for r in range(world)]
    steps = [list(partition.rank_steps(remaining, global_batch, r, world)) for r in range(world)]
    start = 0
    cursor = [0] * world
    for index, samples in enumerate(partition.step_sizes(remaining, global_batch)):
        merged = []
        for r in range(world):
            share = steps[r][index][1]
            assert steps[r][index][0] == samples
            merged += positions[r][cursor[r] : cursor[r] + share]
            cursor[r] += share
        assert merged == list(range(start, start + samples))
        start += samples
    assert start == remaining
    for r in range(world):
        assert partition.rank_count(remaining, global_batch, r, world) == len(positions[r])


def test_shares_are_contiguous_and_as_even_as_possible():
    assert partition.shares(8, 2) == [4, 4]
    assert partition.shares(5, 2) == [3, 2]
    assert partition.shares(3, 4) == [1, 1, 1, 0]


def test_a_step_boundary_restart_partitions_the_rest_as_an_uninterrupted_run_would():
    full = partition.rank_positions(44, 8, 1, 2).tolist()
    resumed = (partition.rank_positions(44 - 16, 8, 1, 2) + 16).tolist()
    assert resumed == [p for p in full if p >= 16]


def test_a_tail_that_would_leave_ranks_out_of_step_is_refused():
    partition.check_lockstep(44, 8, 4, 2)  # tail 4: 2 + 2, one micro-batch each
    partition.check_lockstep(41, 8, 4, 1)  # one rank: anything goes
    with pytest.raises(ConfigError, match="drop_last=True"):
        partition.check_lockstep(41, 8, 4, 2)  # tail 1: rank 1 would get nothing
    partition.check_lockstep(45, 16, 4, 2)  # tail 13: 7 + 6 samples, 2 micro-batches each
    with pytest.raises(ConfigError, match="equal numbers"):
        partition.check_lockstep(25, 16, 4, 2)  # tail 9: 5 + 4 samples, 2 and 1 micro-batches


def test_the_sampler_yields_each_ranks_share_of_the_epoch():
    single = ResumableSampler(44, seed=3)
    single.global_batch = 8
    single.set_epoch(1, start=16)
    ranks = []
    for rank in range(2):
        sampler = ResumableSampler(44, seed=3)
        sampler.global_batch, sampler.rank, sampler.world_size = 8, rank, 2
        sampler.set_epoch(1, start=16)
        ranks.append(list(sampler))
        assert len(sampler) == len(ranks[-1])
        assert all(i.epoch == 1 for i in ranks[-1])
        assert sampler.remaining() == 28
    order = list(single)
    for step in range(4):  # three full steps of 4 + 4, then a tail of 2 + 2
        share = 4 if step < 3 else 2
        expected = order[step * 8 : step * 8 + 2 * share]
        assert ranks[0][step * 4 : step * 4 + share] + ranks[1][step * 4 : step * 4 + share] \
            == expected
