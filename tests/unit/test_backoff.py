"""The one back-off rule of every retry loop (hl-smi, a host's poller, a remote run's follower)."""

from __future__ import annotations

import pytest

from gaudi_gui.core.backoff import Backoff, phase_s


def test_doubles_up_to_the_cap_and_starts_over_after_a_success() -> None:
    backoff = Backoff(1.0, 30.0)
    assert [backoff.next() for _ in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff.delay_s == 30.0
    backoff.reset()
    assert backoff.delay_s == 1.0 and backoff.next() == 1.0


def test_each_host_has_its_own_fixed_phase_in_the_period() -> None:
    names = [f"gaudi-{i:02d}" for i in range(16)]
    phases = [phase_s(name, 5.0) for name in names]
    assert all(0 <= p < 5.0 for p in phases)
    assert phases == [phase_s(name, 5.0) for name in names]  # the same at every start
    assert len({round(p, 3) for p in phases}) >= 14  # apart, not together
    assert phase_s("gaudi-01", 30.0) == pytest.approx(6 * phase_s("gaudi-01", 5.0))  # same place, any period
    assert phase_s("gaudi-01", 0) == 0.0
