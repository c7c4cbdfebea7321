"""The real one-node Slurm cluster (tests/slurm_cluster.py) for the tests here, started once for the
session as root, as CI runs. A machine where it cannot start fails these tests with the reason (not
root, slurm-wlm / munge not installed, a daemon's log): they are never skipped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.remote.conftest import ssh_host  # noqa: F401 (the --login tests' SSH server)
from tests.slurm_cluster import ClusterError, SlurmCluster


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    cluster = SlurmCluster()
    try:
        cluster.start()
    except ClusterError as exc:
        cluster.stop()
        pytest.fail(f"the Slurm test cluster could not start: {exc}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """The cluster, with SLURM_CONF set for this test's commands (and what they start)."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    return slurm_cluster
