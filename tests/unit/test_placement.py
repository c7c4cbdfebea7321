"""core/placement: one value says where work runs, for every kind of work."""

from __future__ import annotations

import shlex
import sys

import pytest

from gaudi_gui.core.placement import Placement
from gaudi_gui.core.remote import Host, HostError


def test_local_runs_the_command_with_this_interpreter() -> None:
    p = Placement.local([0, 1])
    assert p.is_local and p.places == [Host.local()] and p.cards_of("local") == [0, 1]
    assert p.start_argv(Host.local(), ["serve", "--port", "8000"]) == [
        sys.executable, "-m", "gaudi_gui", "serve", "--port", "8000"]
    assert p.cli_args() == [] and p.problems() == []
    assert p.preview(["eval", "--run", "a b"]) == "gaudi-gui eval --run 'a b'"


def test_a_host_runs_under_the_guard_with_every_word_quoted() -> None:
    host = Host.parse("gg-a", "docker exec -i box python3 -m gaudi_gui")
    p = Placement.on_host(host, [4, 5])
    argv = p.start_argv(host, ["serve", "--model", "$(touch PWNED)"], grace=3,
                        env={"HABANA_VISIBLE_MODULES": "4,5"})
    assert argv[0] == "ssh" and argv[-2] == "gg-a" and argv[argv.index("--") + 1] == "gg-a"
    words = shlex.split(argv[-1])
    assert words[:5] == ["docker", "exec", "-i", "box", "python3"]
    assert words[words.index("guard"):words.index("--") + 1] == [
        "guard", "--grace", "3", "--gaudi-gui", "--env", "HABANA_VISIBLE_MODULES=4,5", "--"]
    assert words[-1] == "$(touch PWNED)"  # data, one word
    assert p.cli_args() == ["--host", "gg-a", "--remote-command", "docker exec -i box python3 -m gaudi_gui"]
    assert p.label == "gg-a" and p.cards_of("gg-a") == [4, 5] and p.cards_of("gg-b") == []


def test_several_hosts_and_their_problems() -> None:
    a, b = Host.parse("gg-a"), Host.parse("gg-b")
    p = Placement.on_hosts([a, b], {"gg-a": [0, 1], "gg-b": [0]})
    assert p.places == [a, b] and p.cli_args()[:2] == ["--hosts", "gg-a,gg-b"]
    assert [f for f, _m in p.problems()] == ["cards"]
    with pytest.raises(HostError, match="at least two"):
        Placement.on_hosts([a])
    with pytest.raises(HostError, match="named twice"):
        Placement.on_hosts([a, a])
    assert Placement.on_host(Host.local()).kind == "local"


def test_from_cli_and_the_record_round_trip() -> None:
    found = Placement.from_cli(host="gg-a", remote_command="py -m gaudi_gui",
                               find=Host.parse)
    assert found.kind == "host" and found.host.remote_command == "py -m gaudi_gui"
    assert Placement.from_cli(hosts="gg-a, gg-b", find=Host.parse).kind == "hosts"
    assert Placement.from_cli(slurm=True).cli_args() == ["--slurm"]
    assert Placement.from_cli().kind == "local"
    for p in (Placement.local([3]), found, Placement.on_slurm({"partition": "gaudi"}),
              Placement.on_hosts([Host.parse("gg-a"), Host.parse("gg-b")], {"gg-a": [1], "gg-b": [2]})):
        assert Placement.from_record(p.to_record()) == p
    for broken in ({"kind": "moon"}, {"kind": "host", "hosts": "x"},
                   {"kind": "local", "cards": {"local": ["x"]}},
                   {"kind": "host", "hosts": [{"name": "-oProxyCommand=x"}]}):
        with pytest.raises(HostError):
            Placement.from_record(broken)


def test_a_slurm_placement_carries_its_sbatch_options_and_login() -> None:
    from gaudi_gui.core.slurm import SlurmOptions, SlurmTarget
    target = SlurmTarget(SlurmOptions(nodes=2, partition="gaudi", time="1:00:00", cards_per_node=8,
                                      device="hpu", preflight=False), "login-1")
    p = Placement.on_slurm(target.to_record())
    assert p.slurm_target() == target and Placement.from_record(p.to_record()).slurm_target() == target
    # A damaged value takes its default; validate() then speaks about what is left.
    broken = SlurmTarget.from_record({"nodes": "two", "login": ""})
    assert broken.options.nodes == 1 and broken.login == "local"
