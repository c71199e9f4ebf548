"""Which wheelhouse a resumed run's node gets: the user's choice first (the resume's
command line, then what was recorded at freeze/push, then the environment), then the one
already in the store, then a default by where the run goes."""

from __future__ import annotations

import pytest

from burst.env import wheelhouse
from burst.env.lockfile import Package
from burst.env.wheelchoice import Choice
from burst.errors import ConfigError
from burst.plan import cards, planner, regions
from burst.resume.wheelpolicy import decide
from tests.helpers.env_helpers import tiny_lockfile
from tests.helpers.plan_helpers import facts

LOCK = tiny_lockfile(Package("numpy", "2.1.0"), Package("torch", "2.5.1"))
BEIJING = {"beijing": {"kubernetes": ["bj-a100"], "ssh": ["bj-lab"]}}
NOTHING = Choice()


def candidates(*infra: str | None) -> list[planner.Plan]:
    card = cards.load().get("H100")
    return [planner.plan_for(facts(), planner.Target(card, place=regions.place(i)))
            for i in infra]


def beijing() -> list[planner.Plan]:
    """The beijing profile's places: the user's clusters there, then nearby public regions."""
    card = cards.load().get("H100")
    return [planner.plan_for(facts(), planner.Target(card, place=p))
            for p in regions.profile("beijing", BEIJING).places]


def policy(plans=(), to="skypilot", flags=NOTHING, recorded=NOTHING, stored=None,
           environ=None) -> str:
    decision = decide(LOCK, flags=flags, recorded=recorded, stored=stored,
                      candidates=list(plans), to=to, environ=environ or {})
    return decision.target.policy


def test_public_cloud_candidates_default_to_no_torch():
    assert policy(candidates("aws/us-east-1", "gcp/us-central1", None)) == "no-torch"


def test_own_capacity_in_beijing_gets_the_whole_wheelhouse():
    assert policy(beijing()) == "all"


def test_the_reason_names_the_own_capacity():
    decision = decide(LOCK, flags=NOTHING, recorded=NOTHING, stored=None,
                      candidates=beijing(), to="skypilot", environ={})
    assert "k8s/bj-a100" in decision.why and "ssh/bj-lab" in decision.why


def test_the_local_stub_gets_the_whole_wheelhouse():
    assert policy(candidates(None), to="local") == "all"


def test_an_ssh_box_gets_the_whole_wheelhouse():
    assert policy(candidates(None), to="ssh://me@gpu-box") == "all"


def test_a_recorded_choice_beats_the_default_by_target():
    assert policy(beijing(), recorded=Choice("no-torch")) == "no-torch"


def test_the_resume_command_line_beats_the_recorded_choice():
    assert policy(flags=Choice("all"), recorded=Choice("no-torch")) == "all"


def test_a_resume_flag_overrides_only_its_own_field():
    decision = decide(LOCK, flags=Choice(torch_variant="cu128"), recorded=Choice("no-torch"),
                      stored=None, candidates=[], to="local", environ={})
    assert (decision.target.policy, decision.target.torch_variant) == ("no-torch", "cu128")


def test_the_recorded_choice_beats_the_environment():
    assert policy(recorded=Choice("no-torch"),
                  environ={wheelhouse.POLICY_ENV: "all"}) == "no-torch"


def test_the_environment_beats_the_default_by_target():
    assert policy(candidates("aws/us-east-1"), environ={wheelhouse.POLICY_ENV: "all"}) == "all"


def test_the_wheelhouse_already_in_the_store_is_kept_when_nothing_was_chosen():
    stored = wheelhouse.target_for(LOCK, policy="all", torch_variant="cu124").to_json()
    decision = decide(LOCK, flags=NOTHING, recorded=NOTHING, stored={"target": stored},
                      candidates=candidates("aws/us-east-1"), to="skypilot", environ={})
    assert decision.target.to_json() == stored and "already in the store" in decision.why


@pytest.mark.parametrize("bad", [{"policy": "some"}, {"machine": "sparc"}])
def test_a_choice_outside_the_known_values_is_refused(bad):
    with pytest.raises(ConfigError, match="must be one of"):
        Choice(**bad)
