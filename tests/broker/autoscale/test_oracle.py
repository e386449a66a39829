"""The perfect-foresight yardsticks: hand-computed packing-oracle and lower-bound figures, and their order
against each other and against simulated plans."""

from __future__ import annotations

import pytest

from broker.autoscale.oracle import OracleResult, hosts_needed_steps, lower_bound, packing_oracle
from broker.autoscale.plans import DEFAULT_PLAN
from broker.autoscale.simulate import Arrival, SimConfig, simulate, synthetic_demand
from broker.models import PoolConfig

H = 86_400.0


def test_one_session_starts_one_boot_before_and_stops_when_it_ends() -> None:
    demand = [Arrival(1000.0, 600.0)]
    assert packing_oracle(demand, 4, 300, H) == OracleResult(host_hours=0.25, starts=1, peak_hosts_on=1)
    assert lower_bound(demand, 4, 300, H) == 0.25  # 700 s .. 1600 s


def test_a_start_never_precedes_time_zero_and_billing_stops_at_the_horizon() -> None:
    assert packing_oracle([Arrival(100.0, 600.0)], 4, 300, H).host_hours == pytest.approx(700 / 3600)
    assert packing_oracle([Arrival(0.0, 36_000.0), Arrival(3600.0, 60.0)], 1, 300, 3600.0).host_hours == 1.0
    assert lower_bound([Arrival(0.0, 36_000.0)], 1, 300, 3600.0) == 1.0


def test_five_sessions_on_four_seats_take_two_hosts() -> None:
    demand = [Arrival(1000.0, 600.0)] * 5
    r = packing_oracle(demand, 4, 300, H)
    assert (r.host_hours, r.starts, r.peak_hosts_on) == (0.5, 2, 2)
    assert lower_bound(demand, 4, 300, H) == 0.5


def test_fragmentation_costs_the_oracle_but_not_the_bound() -> None:
    # two seats: A and B fill host 0; C opens host 1; B leaves, so from 2000 s two hosts hold one session each
    demand = [Arrival(1000.0, 8000.0), Arrival(1000.0, 1000.0), Arrival(1500.0, 7500.0)]
    r = packing_oracle(demand, 2, 300, H)
    assert r.host_hours * 3600 == pytest.approx(8300 + 7800)  # host 0: 700..9000, host 1: 1200..9000
    # ceil(concurrent / 2): 1 on [1000, 1500), 2 on [1500, 2000), 1 on [2000, 9000); looking 300 s ahead:
    # 1 on [700, 1200), 2 on [1200, 2000), 1 on [2000, 9000)
    assert lower_bound(demand, 2, 300, H) * 3600 == pytest.approx(500 + 2 * 800 + 7000)


def test_depth_first_packs_onto_the_fullest_host() -> None:
    # three seats: A, B, C fill host 0; B leaves at 1000 and D takes its seat at 2000 (the only free one);
    # E at 2500 finds host 0 full and starts host 1 (200 s .. 2600 s billed from 2200 s)
    demand = [Arrival(0.0, 5000.0), Arrival(0.0, 1000.0), Arrival(500.0, 5000.0), Arrival(2000.0, 1000.0),
              Arrival(2500.0, 100.0)]
    assert packing_oracle(demand, 3, 300, H) == OracleResult(host_hours=(5500 + 400) / 3600, starts=2,
                                                             peak_hosts_on=2)
    # two seats: A and B fill host 0, C opens host 1 (billed from 200 s); B leaves, so each host holds one
    # session when D comes: equal load, the lowest index takes it and no third host starts
    two = [Arrival(0.0, 9000.0), Arrival(0.0, 1000.0), Arrival(500.0, 9000.0), Arrival(2000.0, 100.0)]
    r = packing_oracle(two, 2, 300, H)
    assert (r.starts, r.peak_hosts_on) == (2, 2)
    assert r.host_hours * 3600 == pytest.approx(9000 + 9300)  # host 0: 0..9000, host 1: 200..9500


def test_a_host_needed_again_before_it_would_stop_is_kept_on() -> None:
    # one seat: A ends at 2000; B at 2100 would need a start at 1800, before A ended: the host stays on
    demand = [Arrival(1000.0, 1000.0), Arrival(2100.0, 400.0)]
    assert packing_oracle(demand, 1, 300, H) == OracleResult(host_hours=0.5, starts=1, peak_hosts_on=1)
    assert lower_bound(demand, 1, 300, H) == 0.5  # the 100 s gap lies inside the 300 s look-ahead
    # with a long gap the host stops and starts again, each start billed its boot time
    far = [Arrival(1000.0, 1000.0), Arrival(5000.0, 400.0)]
    assert packing_oracle(far, 1, 300, H) == OracleResult(host_hours=(1300 + 700) / 3600, starts=2,
                                                          peak_hosts_on=1)


def test_steps_process_ends_before_arrivals_at_equal_times() -> None:
    demand = [Arrival(0.0, 100.0), Arrival(100.0, 100.0)]  # back to back on one seat: never two at once
    assert hosts_needed_steps(demand, 1, H) == [(0.0, 1), (200.0, 0)]
    # with no boot time the host stops at 100 s and starts again at once: two starts, 200 s billed
    assert packing_oracle(demand, 1, 0, H) == OracleResult(host_hours=200 / 3600, starts=2, peak_hosts_on=1)


def test_bad_seats_are_refused() -> None:
    with pytest.raises(ValueError, match="seats_per_host"):
        packing_oracle([], 0, 300, H)
    with pytest.raises(ValueError, match="seats_per_host"):
        lower_bound([], 0, 300, H)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_bound_below_oracle_below_simulated_plans(seed: int) -> None:
    demand = synthetic_demand(120, 1, seed=seed)
    bound = lower_bound(demand, 4, 300, H)
    oracle = packing_oracle(demand, 4, 300, H)
    work = sum(min(a.at_s + a.duration_s, H) - a.at_s for a in demand) / 4 / 3600  # perfectly packed seats
    assert work <= bound <= oracle.host_hours
    cfg = SimConfig(PoolConfig("o", max_queue=10_000), hosts=60, seats_per_host=4, days=1)
    assert oracle.host_hours < simulate(demand, cfg, DEFAULT_PLAN).host_hours
