"""The one back-off rule of every retry loop (hl-smi, a host's poller, a remote run's follower)."""

from __future__ import annotations

from gaudi_gui.core.backoff import Backoff


def test_doubles_up_to_the_cap_and_starts_over_after_a_success() -> None:
    backoff = Backoff(1.0, 30.0)
    assert [backoff.next() for _ in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff.delay_s == 30.0
    backoff.reset()
    assert backoff.delay_s == 1.0 and backoff.next() == 1.0
