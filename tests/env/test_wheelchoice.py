"""The wheelhouse choice a run records in its store at freeze or push."""

from __future__ import annotations

import pytest

from burst.env import wheelchoice
from burst.env.wheelchoice import Choice
from burst.errors import ConfigError
from burst.store import MemoryStore


@pytest.fixture
def store():
    return MemoryStore("wheel-choice")


def test_nothing_recorded_reads_as_an_empty_choice(store):
    assert wheelchoice.recorded(store, "run").empty


def test_a_recorded_choice_reads_back(store):
    wheelchoice.record(store, "run", Choice("no-torch", "aarch64", "cu128"))
    assert wheelchoice.recorded(store, "run") == Choice("no-torch", "aarch64", "cu128")


def test_a_later_choice_keeps_what_it_leaves_open(store):
    wheelchoice.record(store, "run", Choice("no-torch"))
    wheelchoice.record(store, "run", Choice(torch_variant="cu128"))
    assert wheelchoice.recorded(store, "run") == Choice("no-torch", None, "cu128")


def test_an_empty_choice_writes_nothing(store):
    wheelchoice.record(store, "run", Choice())
    assert store.size(wheelchoice.key("run")) is None


def test_a_damaged_record_is_a_one_line_error(store):
    store.put(wheelchoice.key("run"), b"{not json")
    with pytest.raises(ConfigError, match="is not JSON"):
        wheelchoice.recorded(store, "run")


def test_the_environment_is_read_as_a_choice():
    assert wheelchoice.from_environment({"BURST_WHEELS": "no-torch",
                                         "BURST_WHEELS_TORCH": "cpu"}) == \
        Choice("no-torch", None, "cpu")


def test_push_without_flags_keeps_the_choice_recorded_before(store):
    from tests.helpers.env_helpers import tiny_lockfile

    wheelchoice.record(store, "run", Choice("no-torch"))
    target = wheelchoice.choose(store, "run", tiny_lockfile(), Choice(), local=False,
                                environ={"BURST_WHEELS": "all"})
    assert target is not None and target.policy == "no-torch"
