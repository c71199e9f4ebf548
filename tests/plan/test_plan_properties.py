"""Properties every plan has, whatever the model, the card and the batch."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from burst.plan import cards as gpus
from burst.plan import memory
from burst.plan.facts import RunFacts
from burst.plan.planner import Options, PlanError, Target, check_split, micro_batches, plan_for

CARDS = list(gpus.builtin())
GIB = 1 << 30


@st.composite
def runs(draw) -> RunFacts:
    static = memory.Static(*(draw(st.integers(0, 40 * GIB)) for _ in range(3)),
                           float32_params=draw(st.integers(0, 10 * GIB)))
    peaks = draw(st.dictionaries(st.integers(1, 256), st.integers(1, 200 * GIB), max_size=4))
    model = memory.fit(static, peaks, draw(st.sampled_from([None, "bf16", "fp16"])),
                       draw(st.sampled_from([1, 2, 8])))
    global_batch = draw(st.integers(1, 2048))
    micro = draw(st.integers(1, global_batch))
    return RunFacts("run", global_batch, micro, model.world_size, model.amp, "cpu", model)


targets = st.builds(Target, st.sampled_from(CARDS), st.sampled_from([1, 2, 3, 4, 8]),
                    st.sampled_from([1, 2]))
options = st.builds(Options, margin=st.floats(0.3, 1.0),
                    amp=st.sampled_from(["auto", "fp16", "none"]))


@settings(max_examples=400, deadline=None)
@given(run=runs(), target=targets, opts=options)
def test_every_plan_preserves_the_global_batch_and_fits_under_the_margin(run, target, opts):
    try:
        plan = plan_for(run, target, opts)
    except PlanError as error:
        assert "\n" not in str(error)
        return
    assert plan.micro_batch * plan.accumulation * plan.world_size == run.global_batch
    assert plan.micro_batch >= 1 and plan.accumulation >= 1
    assert plan.budget_bytes <= opts.margin * target.card.memory_bytes
    if plan.probe:
        assert run.memory.fixed(plan.amp, plan.world_size) <= plan.budget_bytes
        assert plan.micro_batch in plan.probe_micro_batches
    else:
        assert plan.peak_bytes == run.memory.predict(plan.micro_batch, plan.amp, plan.world_size)
        assert plan.peak_bytes <= plan.budget_bytes
        assert plan.probe_micro_batches[0] == plan.micro_batch


@settings(max_examples=300, deadline=None)
@given(run=runs(), target=targets)
def test_no_larger_split_would_have_fitted(run, target):
    try:
        plan = plan_for(run, target)
    except PlanError:
        return
    if plan.probe:
        return
    larger = [m for m in micro_batches(run.global_batch, plan.world_size) if m > plan.micro_batch]
    for micro in larger:
        assert run.memory.predict(micro, plan.amp, plan.world_size) > plan.budget_bytes


@given(global_batch=st.integers(1, 5000), count=st.integers(1, 16), nodes=st.integers(1, 4))
def test_a_refused_split_offers_only_layouts_that_split_exactly(global_batch, count, nodes):
    world = count * nodes
    try:
        check_split(global_batch, count, nodes)
    except PlanError as error:
        assert global_batch % world
        assert all(global_batch % w == 0 for w in error.choices["world_sizes"])
        assert all(b % world == 0 and b > 0 for b in error.choices["global_batches"])
    else:
        assert global_batch % world == 0
