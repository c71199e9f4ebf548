"""GPU watch: the memory alert rule on synthetic traces, and the watch without NVML."""

from __future__ import annotations

from burst.supervise.gpuwatch import GpuSample, GpuWatch, MemoryAlert

GIB = 1 << 30


def sample(used_gib: float, index: int = 0) -> GpuSample:
    return GpuSample(index=index, name="NVIDIA A10G", memory_used=int(used_gib * GIB),
                     memory_total=24 * GIB)


def test_memory_above_threshold_for_the_sustain_time_alerts_once_with_the_peak():
    rule = MemoryAlert(threshold=0.8, sustain_s=300)
    fired = [rule.feed(sample(used), t) for t, used in
             [(0, 20), (100, 22), (200, 21), (299, 20), (300, 20), (400, 23)]]
    alerts = [a for a in fired if a]
    assert len(alerts) == 1 and fired[4] is alerts[0]
    assert alerts[0]["peak_bytes"] == 22 * GIB and alerts[0]["seconds_above"] == 300


def test_dipping_below_the_threshold_restarts_the_clock():
    rule = MemoryAlert(threshold=0.8, sustain_s=300)
    trace = [(0, 20), (200, 10), (250, 20), (500, 20), (549, 20)]
    fired = [rule.feed(sample(used), t) for t, used in trace]
    assert fired == [None] * 5


def test_a_new_excursion_after_recovery_alerts_again():
    rule = MemoryAlert(threshold=0.8, sustain_s=10)
    trace = [(0, 20), (10, 20), (20, 5), (30, 20), (40, 20)]
    assert sum(1 for t, used in trace if rule.feed(sample(used), t)) == 2


class FakeNvml:
    """Stands in for the NVML library only: the watch's own logic runs for real."""

    def __init__(self, traces: dict[int, list[float]]) -> None:
        self.traces, self.calls = traces, 0

    def sample(self) -> list[GpuSample]:
        self.calls += 1
        return [sample(t[min(self.calls - 1, len(t) - 1)], i) for i, t in self.traces.items()]

    def xid_events(self) -> list[dict]:
        return [{"xid": 79, "event_type": 8}] if self.calls == 2 else []

    def close(self) -> None:
        pass


def test_each_gpu_has_its_own_alert_and_peak_and_xid_events_are_recorded():
    recorded: list[tuple[str, dict]] = []
    nvml = FakeNvml({0: [20, 20, 20], 1: [5, 23, 5]})
    watch = GpuWatch(lambda name, **f: recorded.append((name, f)), sustain_s=10,
                     reader=lambda: nvml)
    watch._nvml, watch.available = nvml, True
    for t in (0, 10, 20):
        watch.poll(t)
    alerts = [f for name, f in recorded if name == "memory-alert"]
    assert [a["gpu"] for a in alerts] == [0]
    assert watch.peak_bytes == {0: 20 * GIB, 1: 23 * GIB}
    assert ("xid", {"xid": 79, "event_type": 8}) in recorded


def test_without_nvml_the_watch_reports_once_and_stays_off():
    recorded: list[tuple[str, dict]] = []

    def no_nvml():
        raise RuntimeError("NVML unavailable: NVML Shared Library Not Found")

    watch = GpuWatch(lambda name, **f: recorded.append((name, f)), reader=no_nvml)
    assert watch.start() is False
    watch.stop()
    assert recorded == [("gpu-watch", {"available": False,
                                       "reason": "NVML unavailable: NVML Shared Library Not Found"})]
