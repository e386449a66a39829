"""The node watchdog's pure policy: exact decisions and reasons over a driven clock."""

from __future__ import annotations

from streamer.node.watchdog import Limits, Sample, WatchdogState, decide, released

LIM = Limits(max_temp_c=90, throttle_hold_ms=60_000, vram_growth_mb=2048, max_session_failures=3,
             max_loop_lag_ms=1000, healthy_hold_ms=300_000, max_trips=3, trip_window_ms=3_600_000)


def gpu(temp: float = 60, throttle: tuple[str, ...] = (), vram: float = 4000, index: int = 0) -> dict[str, object]:
    return {"index": index, "temperature_c": temp, "throttle_reasons": list(throttle), "vram_used_mb": vram}


def sample(*gpus: dict[str, object], sessions: int = 2, failures: int = 0, lag: float = 5) -> Sample:
    return Sample(gpus=list(gpus) or [gpu()], sessions=sessions, session_failures=failures, loop_lag_ms=lag)


def run(state: WatchdogState, s: Sample, now_ms: int) -> tuple[str, str, WatchdogState]:
    d, nxt = decide(state, s, now_ms, LIM)
    return d.action, d.reason, nxt


def test_healthy_host_is_left_alone_and_nvml_nulls_are_not_problems() -> None:
    st = WatchdogState()
    for t in range(0, 600_000, 5_000):
        action, _, st = run(st, sample(gpu(), {"index": 1, "temperature_c": None, "throttle_reasons": None,
                                               "vram_used_mb": None}), t)
        assert action == "none"
    assert not st.drained and st.trips_ms == ()


def test_hot_gpu_drains_then_undrains_after_the_healthy_hold() -> None:
    action, reason, st = run(WatchdogState(), sample(gpu(temp=93)), 0)
    assert (action, reason) == ("drain", "gpu_hot: GPU 0 at 93 C (limit 90 C)")
    action, _, st = run(st, sample(gpu(temp=93)), 5_000)  # still hot: already drained, nothing new
    assert action == "none" and st.drained
    action, _, st = run(st, sample(gpu(temp=70)), 10_000)  # cool from here on
    assert action == "none" and st.healthy_since_ms == 10_000
    action, _, st = run(st, sample(gpu(temp=70)), 309_999)
    assert action == "none"
    action, reason, st = run(st, sample(gpu(temp=70)), 310_000)
    assert (action, reason) == ("undrain", "healthy for 300 s") and not st.drained


def test_a_relapse_restarts_the_healthy_hold() -> None:
    _, _, st = run(WatchdogState(), sample(gpu(temp=95)), 0)
    _, _, st = run(st, sample(gpu(temp=70)), 10_000)
    action, _, st = run(st, sample(gpu(temp=91)), 200_000)
    assert action == "none" and st.healthy_since_ms is None
    _, _, st = run(st, sample(gpu(temp=70)), 205_000)
    assert run(st, sample(gpu(temp=70)), 504_999)[0] == "none"
    assert run(st, sample(gpu(temp=70)), 505_000)[0] == "undrain"


def test_heat_or_power_throttling_must_last_but_idle_clocks_never_count() -> None:
    st = WatchdogState()
    action, _, st = run(st, sample(gpu(throttle=("gpu_idle", "sw_power_cap"))), 0)
    assert action == "none" and st.throttled_since_ms == {}
    action, _, st = run(st, sample(gpu(throttle=("hw_thermal",))), 10_000)
    assert action == "none" and st.throttled_since_ms == {0: 10_000}
    action, _, st = run(st, sample(gpu(throttle=("hw_thermal", "hw_slowdown"))), 69_999)
    assert action == "none"
    action, reason, st = run(st, sample(gpu(throttle=("hw_thermal",))), 70_000)
    assert (action, reason) == ("drain", "gpu_throttled: GPU 0 hw_thermal for 60 s")
    # a throttle that stops resets its clock
    _, _, fresh = run(WatchdogState(), sample(gpu(throttle=("hw_thermal",))), 0)
    _, _, fresh = run(fresh, sample(gpu()), 30_000)
    assert run(fresh, sample(gpu(throttle=("hw_thermal",))), 80_000)[0] == "none"


def test_vram_growth_without_session_change_is_a_leak_and_new_sessions_move_the_baseline() -> None:
    st = WatchdogState()
    _, _, st = run(st, sample(gpu(vram=4000), sessions=2), 0)
    _, _, st = run(st, sample(gpu(vram=9000), sessions=3), 5_000)  # a new session: more memory is fine
    assert st.vram_base_mb == {0: 9000.0}
    action, _, st = run(st, sample(gpu(vram=11_047), sessions=3), 10_000)
    assert action == "none"
    action, reason, st = run(st, sample(gpu(vram=11_048), sessions=3), 15_000)
    assert (action, reason) == ("drain", "vram_leak: GPU 0 VRAM +2048 MiB with 3 session(s) unchanged")


def test_failed_sessions_and_a_late_event_loop_drain_with_every_reason() -> None:
    _, _, st = run(WatchdogState(), sample(failures=4), 0)  # failures before the first sample are history
    action, reason, st = run(st, sample(failures=6), 5_000)
    assert action == "none"
    action, reason, _ = run(st, sample(gpu(temp=95), failures=9, lag=1500), 10_000)
    assert action == "drain"
    assert reason == ("gpu_hot: GPU 0 at 95 C (limit 90 C); session_failures: 3 session(s) failed to start or "
                      "stream; loop_lag: event loop 1500 ms late (limit 1000 ms)")


def test_repeated_trips_hold_the_host_drained_for_an_operator() -> None:
    st, now = WatchdogState(), 0
    for _ in range(2):
        assert run(st, sample(gpu(temp=95)), now)[0] == "drain"
        _, _, st = run(st, sample(gpu(temp=95)), now)
        _, _, st = run(st, sample(gpu(temp=70)), now + 1_000)
        action, _, st = run(st, sample(gpu(temp=70)), now + 301_000)
        assert action == "undrain"
        now += 400_000
    action, _, st = run(st, sample(gpu(temp=95)), now)  # third trip within the hour
    assert action == "drain" and len(st.trips_ms) == 3
    _, _, st = run(st, sample(gpu(temp=70)), now + 1_000)
    action, reason, st = run(st, sample(gpu(temp=70)), now + 301_000)
    assert (action, reason) == ("hold_for_operator",
                                "tripped 3 times in 60 min: stays drained until an operator undrains it")
    assert run(st, sample(gpu(temp=70)), now + 900_000)[0] == "none" and st.held
    action, _, st = run(st, sample(gpu(temp=99), lag=2000), now + 905_000)
    assert action == "none" and st.held  # held: no new trip either, but the checks failing are reported
    assert st.tripped == {"gpu_hot", "loop_lag"}

    # an operator undrains it: a clean slate, and the next sick sample drains it again (a first trip)
    st = released(st)
    assert (st.drained, st.held, st.trips_ms, st.tripped) == (False, False, (), frozenset())
    action, _, st = run(st, sample(gpu(temp=70)), now + 910_000)
    assert action == "none"
    action, _, st = run(st, sample(gpu(temp=95)), now + 915_000)
    assert action == "drain" and st.trips_ms == (now + 915_000,) and st.tripped == {"gpu_hot"}


def test_tripped_names_the_checks_of_the_current_drain_until_the_undrain() -> None:
    _, _, st = run(WatchdogState(), sample(gpu(temp=60)), 0)
    assert st.tripped == frozenset()
    _, _, st = run(st, sample(gpu(temp=95)), 5_000)
    assert st.drained and st.tripped == {"gpu_hot"}
    _, _, st = run(st, sample(gpu(temp=70), lag=1500), 10_000)  # cooler, but the loop lags: both stay named
    assert st.tripped == {"gpu_hot", "loop_lag"}
    _, _, st = run(st, sample(gpu(temp=70)), 15_000)  # healthy: still drained, the checks still named
    assert st.tripped == {"gpu_hot", "loop_lag"}
    action, _, st = run(st, sample(gpu(temp=70)), 315_000)
    assert action == "undrain" and st.tripped == frozenset()


def test_a_failed_selftest_drains_and_a_passing_one_lets_the_host_undrain() -> None:
    failing = Sample(gpus=[gpu()], sessions=0, session_failures=0, loop_lag_ms=5,
                     selftest_failure="2 corrupt frame(s) (first: frame 41: PSNR 14.9 dB under 22)")
    action, reason, st = run(WatchdogState(), failing, 0)
    assert (action, reason) == ("drain", "selftest_failed: 2 corrupt frame(s) (first: frame 41: PSNR 14.9 dB under 22)")
    action, _, st = run(st, failing, 5_000)  # the same failed run, still: nothing new
    assert action == "none" and st.drained
    action, _, st = run(st, sample(sessions=0), 10_000)  # a passing run cleared it: the hold starts
    action, _, st = run(st, sample(sessions=0), 310_000)
    assert action == "undrain"


def test_encoder_errors_between_two_heartbeats_drain_the_first_count_is_a_baseline() -> None:
    def errs(n: int) -> Sample:
        return Sample(gpus=[gpu()], sessions=2, session_failures=0, loop_lag_ms=5, encoder_errors=n)

    action, _, st = run(WatchdogState(), errs(500), 0)  # a node restarted with a history: the baseline
    assert action == "none"
    action, _, st = run(st, errs(529), 5_000)  # 29 new: under the limit
    assert action == "none"
    action, reason, st = run(st, errs(559), 10_000)
    assert (action, reason) == ("drain", "encoder_errors: 30 encoder error(s) since the last heartbeat (limit 30)")
