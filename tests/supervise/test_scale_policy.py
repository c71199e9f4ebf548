"""The scale-out rule (``burst run --scale-out``): parsed once, decided from memory samples
and the clock, and fed by the GPU watch from a modelled card whose memory rises."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from burst import events
from burst.cli import main
from burst.errors import ConfigError
from burst.plan.memory import Static, fit
from burst.store import open_store
from burst.supervise.gpuwatch import GpuSample, GpuWatch
from burst.supervise.scale_policy import Action, ScaleMonitor, ScalePolicy, parse

GIB = 1 << 30
RULE = "memory > 80% for 5m: +1 node, max 4"


def policy(**overrides) -> ScalePolicy:
    return ScalePolicy(**{"threshold": 0.8, "window_s": 300, "maximum": 4, **overrides})


def trace(*points: tuple[float, float]) -> list[tuple[float, float]]:
    return list(points)


# -- parsing ---------------------------------------------------------------------------

def test_the_seed_rule_parses_to_its_threshold_window_and_bounds():
    parsed = parse(RULE)
    assert (parsed.threshold, parsed.window_s, parsed.minimum, parsed.maximum) == (0.8, 300, 1, 4)
    assert parsed.settle == 300 and parsed.text == RULE


def test_min_and_settle_are_accepted_in_any_order():
    parsed = parse("Memory > 90% for 30s: +1 node, settle 2m, min 2, max 10")
    assert (parsed.threshold, parsed.window_s, parsed.minimum, parsed.maximum,
            parsed.settle) == (0.9, 30, 2, 10, 120)


@pytest.mark.parametrize("rule, says", [
    ("memory over 80%", "is not a scale-out rule"),
    ("memory > 80% for 5m: +1 node", "needs a max"),
    ("memory > 80% for 5m: +2 nodes, max 4", "one node at a time"),
    ("memory > 80% for 5m: +1 node, max 4, max 5", "each once"),
    ("memory > 80% for 5m: +1 node, max 4, burst 3", "is not one of"),
    ("memory > 80% for 5m: +1 node, min 3, max 2", "1 <= min <= max"),
    ("memory > 80% for 5m: +1 node, max 0", "1 <= min <= max"),
    ("memory > 120% for 5m: +1 node, max 4", "between 0% and 100%"),
    ("memory > 80% for 0m: +1 node, max 4", "longer than zero"),
    ("memory > 80% for 5m: +1 node, max 2m", "whole number of nodes"),
])
def test_a_bad_rule_is_a_one_line_config_error(rule, says):
    with pytest.raises(ConfigError, match=says) as caught:
        parse(rule)
    assert "\n" not in str(caught.value)


# -- deciding ------------------------------------------------------------------------------

def test_no_scale_out_before_the_threshold_is_held_for_the_whole_window():
    samples = trace((0, 0.85), (100, 0.9), (200, 0.95), (299, 0.9))
    assert policy().decide(samples, 299, nodes=1).action is Action.NONE


def test_scale_out_by_one_node_once_the_threshold_is_held_for_the_window():
    samples = trace((0, 0.85), (100, 0.9), (200, 0.95), (300, 0.9))
    decision = policy().decide(samples, 300, nodes=2)
    assert (decision.action, decision.nodes) == (Action.OUT, 3)
    assert "above 80%" in decision.reason and "peak 95%" in decision.reason


def test_one_sample_below_the_threshold_restarts_the_window():
    samples = trace((0, 0.9), (100, 0.7), (150, 0.9), (400, 0.9))
    assert policy().decide(samples, 400, nodes=1).action is Action.NONE
    assert policy().decide([*samples, (450, 0.9)], 450, nodes=1).action is Action.OUT


def test_never_beyond_max_nodes():
    samples = trace((0, 0.9), (300, 0.9))
    decision = policy(maximum=2).decide(samples, 300, nodes=2)
    assert decision.action is Action.NONE and "max 2" in decision.reason


def test_nothing_is_decided_while_the_run_settles_after_a_change():
    samples = trace((0, 0.9), (300, 0.9), (400, 0.9), (500, 0.9))
    assert policy(settle_s=250).decide(samples, 500, nodes=2, changed_at=300).action \
        is Action.NONE


def test_after_settling_a_whole_new_window_is_needed():
    held = trace(*[(t, 0.9) for t in range(0, 1200, 50)])
    rule = policy(settle_s=100)
    # changed at 300: samples count from 400, so the window closes at 700
    assert rule.decide(held, 650, nodes=2, changed_at=300).action is Action.NONE
    assert rule.decide(held, 700, nodes=2, changed_at=300).action is Action.OUT


def test_scale_in_when_memory_on_one_node_fewer_would_stay_below_the_hysteresis_line():
    # 2 nodes: the line is 60% x 1/2 = 30% (as if every byte were sharded)
    samples = trace((0, 0.25), (150, 0.28), (300, 0.2))
    decision = policy().decide(samples, 300, nodes=2)
    assert (decision.action, decision.nodes) == (Action.IN, 1)


def test_no_scale_in_when_one_node_fewer_could_cross_the_line():
    samples = trace((0, 0.45), (150, 0.45), (300, 0.45))  # x2 = 90% on one node
    assert policy().decide(samples, 300, nodes=2).action is Action.NONE


def test_no_scale_in_at_min_nodes():
    samples = trace((0, 0.1), (300, 0.1))
    assert policy(minimum=2).decide(samples, 300, nodes=2).action is Action.NONE
    assert policy().decide(samples, 300, nodes=1).action is Action.NONE


def test_below_min_nodes_asks_for_one_more_at_once():
    decision = policy(minimum=3).decide([], 0, nodes=2)
    assert (decision.action, decision.nodes) == (Action.OUT, 3)


# -- the agent's side: a modelled card -----------------------------------------------------

CARD = 24 * GIB


class ModelledCard:
    """NVML's reading of one card under an FSDP run: the memory model's per-rank peak at
    the run's current micro-batch and the node count the monitor asked for. Weights,
    gradients and optimizer state (16 GiB) are sharded over the nodes; activations grow
    with a curriculum that raises the micro-batch from 4 to 8 samples at t=200s."""

    def __init__(self, monitor: ScaleMonitor) -> None:
        self.monitor, self.now = monitor, 0.0
        static = Static(params=4 * GIB, grads=4 * GIB, optimizer=8 * GIB)
        self.model = fit(static, {4: 16 * GIB + 2 * GIB}, sharded=True)  # 0.5 GiB/sample

    def sample(self) -> list[GpuSample]:
        micro = 4 if self.now < 200 else 8
        used = self.model.predict(micro, world_size=self.monitor.nodes)
        assert used is not None
        return [GpuSample(index=0, name="NVIDIA A10G", memory_used=used, memory_total=CARD)]

    def xid_events(self) -> list[dict]:
        return []

    def close(self) -> None:
        pass


def drive(seconds: int, interval: int = 30) -> tuple[list[tuple[str, dict]], ScaleMonitor]:
    recorded: list[tuple[str, dict]] = []

    def record(name: str, **fields: object) -> None:
        recorded.append((name, fields))

    monitor = ScaleMonitor(parse(RULE), record)
    card = ModelledCard(monitor)
    watch = GpuWatch(record, interval=interval, reader=lambda: card, scale=monitor)
    watch._nvml, watch.available = card, True
    for t in range(0, seconds + 1, interval):
        card.now = t
        watch.poll(t)
    return recorded, monitor


def test_the_modelled_card_is_below_the_threshold_until_the_curriculum_grows():
    recorded, monitor = drive(180)
    assert [f for name, f in recorded if name == "scale-request"] == []
    assert monitor.samples[-1][1] == pytest.approx(18 / 24)


def test_a_modelled_card_adds_a_node_after_the_sustained_threshold_and_not_before():
    # above 80% (20 of 24 GiB) from t=210; the window of 5m closes at t=510
    recorded, _ = drive(480)
    assert [f for name, f in recorded if name == "scale-request"] == []
    recorded, monitor = drive(510)
    requests = [f for name, f in recorded if name == "scale-request"]
    assert [(r["action"], r["nodes"], r["target"]) for r in requests] == [("out", 1, 2)]
    assert "above 80% for 5m00s" in requests[0]["reason"]
    assert monitor.nodes == 2


def test_sharding_over_the_added_node_relieves_the_card_and_nothing_more_is_asked():
    recorded, monitor = drive(3600)
    requests = [f for name, f in recorded if name == "scale-request"]
    assert [(r["action"], r["target"]) for r in requests] == [("out", 2)]
    assert monitor.samples[-1][1] == pytest.approx(12 / 24)  # 8 GiB shard + 4 GiB activations


# -- the CLI ----------------------------------------------------------------------------

def test_burst_run_records_the_parsed_policy_in_the_runs_events(tmp_path):
    store = tmp_path / "store"
    result = CliRunner().invoke(main, ["run", "--run-id", "r", "--store", str(store),
                                       "--local", str(tmp_path / "local"), "--scale-out", RULE,
                                       "--", "python3", "-c", "pass"])
    assert result.exit_code == 0, result.output
    policies = [e for e in events.read(open_store(str(store)), "r")
                if e["event"] == "scale-policy"]
    assert [(p["rule"], p["max"], p["window_seconds"]) for p in policies] == [(RULE, 4, 300)]


def test_burst_run_refuses_a_bad_rule_in_one_line_before_starting_anything(tmp_path):
    store = tmp_path / "store"
    result = CliRunner().invoke(main, ["run", "--run-id", "r", "--store", str(store),
                                       "--scale-out", "memory > 80%", "--",
                                       "python3", "-c", "pass"])
    assert result.exit_code == 2
    assert "is not a scale-out rule" in result.output and "Traceback" not in result.output
    assert not events.exists(open_store(str(store)), "r")
