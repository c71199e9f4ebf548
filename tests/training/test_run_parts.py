"""The parts a Run is made of, as specifications: where it stands (Progress), how a step's
samples split (Layout), and the façade reading them where users look (run.step...)."""

from __future__ import annotations

import dataclasses

import pytest

from burst.errors import ConfigError
from burst.training.forward import Forward
from burst.training.layout import Layout
from burst.training.progress import Progress, StepPhase


def test_next_epoch_starts_the_next_epoch_at_its_first_sample():
    progress = Progress(step=7, epoch=2, samples_consumed=70, samples_in_epoch=30)
    progress.next_epoch()
    assert (progress.epoch, progress.samples_in_epoch) == (3, 0)
    assert (progress.step, progress.samples_consumed) == (7, 70)


def test_an_epoch_rolls_over_only_once_its_last_sample_was_consumed():
    progress = Progress(epoch=1, samples_in_epoch=90)
    progress.finish_epoch_if_done(100)
    assert progress.epoch == 1
    progress.count(10)
    progress.finish_epoch_if_done(100)
    assert (progress.epoch, progress.samples_in_epoch, progress.step) == (2, 0, 1)


def test_a_step_counts_as_stepped_only_after_the_optimizer_ran_inside_it():
    progress = Progress()
    progress.optimizer_started()
    assert progress.optimizing
    progress.optimizer_done()  # outside a step: nothing to count
    assert progress.phase is StepPhase.BETWEEN and not progress.stepped
    progress.begin_step()
    assert progress.in_step and not progress.stepped
    progress.optimizer_started()
    progress.optimizer_done()
    assert progress.stepped and not progress.optimizing
    progress.end_step()
    assert progress.phase is StepPhase.BETWEEN and not progress.in_step


def test_restored_counters_are_the_ones_a_snapshot_records():
    progress = Progress(step=5, epoch=1, samples_consumed=50, samples_in_epoch=10,
                        total_epochs=3, steps_per_epoch=4)
    again = Progress()
    again.restore(progress.counters())
    assert (again.step, again.epoch, again.samples_consumed, again.samples_in_epoch) == \
        (5, 1, 50, 10)
    assert progress.counters()["total_steps"] == 12


def test_a_replanned_layout_keeps_the_global_batch_and_the_loaders_micro_batch():
    layout = Layout.plan(64, 16, rank=0, world_size=1, env={})
    smaller = layout.with_micro(8)
    assert (smaller.global_batch, smaller.micro_batch, smaller.accumulation) == (64, 8, 8)
    assert smaller.planned_micro == 16
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.micro_batch = 8  # type: ignore[misc]


def test_a_plan_from_the_environment_must_agree_with_the_process():
    with pytest.raises(ConfigError, match="BURST_WORLD_SIZE=2"):
        Layout.plan(64, 16, rank=0, world_size=1, env={"BURST_WORLD_SIZE": "2"})
    assert Layout.plan(64, 16, rank=0, world_size=1,
                       env={"BURST_MICRO_BATCH": "32"}).accumulation == 2


def test_a_forwarded_attribute_reads_and_writes_the_part():
    class Facade:
        step: Forward[int] = Forward("progress")
        stepped: Forward[bool] = Forward("progress", "stepped")

        def __init__(self) -> None:
            self.progress = Progress()

    facade = Facade()
    facade.step = 3
    assert facade.progress.step == 3 and facade.step == 3
    assert facade.stepped is False
