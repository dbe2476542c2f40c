"""What a chaos target carries: the hang bound its runs use, and replay commands
that run the same target again (options before a launch target's `--`)."""

from __future__ import annotations

import shlex
from pathlib import Path

from hctool.chaos.report import replay_command
from hctool.chaos.target import CHAOS_HANG_AFTER_S, launch_target, scenario_target


def test_chaos_holds_a_hang_to_its_own_bound_not_the_repros():
    repro_bound = scenario_target("30760", "per-tick", True).scenario.hang_after
    t = scenario_target("30760", "per-tick", True, hang_after=CHAOS_HANG_AFTER_S)
    assert t.scenario.hang_after == CHAOS_HANG_AFTER_S > repro_bound
    assert "--hang-after" not in t.args  # a replay gets chaos's default anyway
    t4 = scenario_target("30760", "per-tick", True, hang_after=4.0)
    assert t4.scenario.hang_after == 4.0 and t4.args[-2:] == ("--hang-after", "4")


def test_launch_replay_puts_options_before_the_engine_flags():
    t = launch_target(["--enable-hierarchical-cache"], hang_after=4.0)
    words = shlex.split(replay_command(Path("s.toml"), t, runs=10))
    engine = words[words.index("--") + 1 :]
    assert engine == ["--tp", "2", "--enable-hierarchical-cache"]
    assert {"--runs", "--hang-after"} <= set(words[: words.index("--")])
