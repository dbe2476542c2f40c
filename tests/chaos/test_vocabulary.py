"""The fault vocabulary and schedules: text form, windows, targets, generation."""

from __future__ import annotations

import pytest

from hctool.chaos.schedule import Schedule, ScheduleError, generate, load_schedule, parse_kinds, schedule_from_dict
from hctool.protocol.faults import FAULT_KINDS, Fault, parse_fault, parse_faults


def test_old_specs_keep_their_text_form():
    for spec in ("free-delay:rank=1,ms=300", "storage-latency:ms=40", "h2d-sleep:rank=0,ms=30"):
        assert parse_fault(spec).spec() == spec


@pytest.mark.parametrize(
    "spec",
    [
        "storage-error:target=one,p=0.3,start_s=2,duration_s=5",
        "clock-jump:rank=1,ms=4000,start_s=3",
        "rank-pause:rank=0,ms=800,start_s=1",
        "request-burst:start_s=2,n=4",
        "request-cancel:ms=100,n=2",
        "storage-partial:rank=1,p=0.5",
        "rank-kill:rank=1,start_s=4",
    ],
)
def test_every_kind_round_trips(spec):
    f = parse_fault(spec)
    assert parse_fault(f.spec()) == f
    assert Fault.from_dict(f.to_dict()) == f


@pytest.mark.parametrize(
    "spec, words",
    [
        ("nope:ms=1", "unknown fault 'nope'"),
        ("free-delay", "needs ms=N"),
        ("free-delay:ms=-1", "must not be negative"),
        ("free-delay:ms=1,p=2", "p must be within"),
        ("free-delay:ms=x", "numbers"),
        ("request-burst:start_s=1", "needs n=N"),
        ("free-delay:ms=1,target=some", "target must be"),
        ("free-delay:ms=1,colour=red", "bad parameter"),
        ("free-delay:ms=1,duration_s=0", "duration_s must be positive"),
    ],
)
def test_bad_specs_say_why(spec, words):
    with pytest.raises(ValueError, match=words):
        parse_fault(spec)


def test_windows_and_one_target():
    f = parse_fault("free-delay:ms=10,start_s=2,duration_s=3")
    assert not f.active(1.9) and f.active(2.0) and f.active(4.9) and not f.active(5.0)
    one = parse_fault("free-delay:target=one,ms=10")
    ranks = {one.resolved(2, salt).rank for salt in range(8)}
    assert ranks == {0, 1} and one.resolved(2, 3) == one.resolved(2, 3)  # deterministic per salt
    assert parse_faults("free-delay:ms=1; storage-latency:ms=2 ;") == [
        parse_fault("free-delay:ms=1"),
        parse_fault("storage-latency:ms=2"),
    ]


def test_heal_clips_every_window():
    s = Schedule(
        (
            parse_fault("free-delay:rank=1,ms=10"),
            parse_fault("d2h-sleep:ms=5,start_s=8,duration_s=10"),
            parse_fault("h2d-sleep:ms=5,start_s=20"),
        ),
        heal_s=12.0,
    )
    healed = s.healed(2)
    assert [(f.kind, f.start_s, f.duration_s) for f in healed] == [("free-delay", 0.0, 12.0), ("d2h-sleep", 8.0, 4.0)]


def test_schedule_toml_round_trip(tmp_path):
    s = generate(7, 3, 2)
    path = tmp_path / "s.toml"
    path.write_text(s.to_toml())
    assert load_schedule(path).faults == s.faults and load_schedule(path).heal_s == s.heal_s


def test_schedule_toml_keeps_quotes_and_backslashes(tmp_path):
    """A path with a quote wrote a replay file tomllib rejected (the writer was f-strings)."""
    s = Schedule(
        (parse_fault("io-delay:path=/data/o'brien/*,ms=50"), parse_fault('io-delay:path=/x/"q"\\y*,ms=5')), seed=2
    )
    path = tmp_path / "s.toml"
    path.write_text(s.to_toml())
    assert load_schedule(path).faults == s.faults


def test_bad_schedule_files(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[[faults]]\nkind = "free-delay"\n')
    with pytest.raises(ScheduleError, match=r"faults\[0\].*needs ms"):
        load_schedule(path)
    with pytest.raises(ScheduleError, match="unknown fields"):
        schedule_from_dict({"fault": []})
    with pytest.raises(ScheduleError, match="unknown fault kind"):
        parse_kinds("free-delay,bogus")


def test_generation_is_seeded_and_uses_only_the_asked_kinds():
    assert generate(1, 5, 2) == generate(1, 5, 2)
    assert generate(1, 5, 2) != generate(2, 5, 2)
    for i in range(50):
        s = generate(4, i, 2, kinds=("free-delay", "rank-pause"))
        assert 1 <= len(s.faults) <= 4 and {f.kind for f in s.faults} <= {"free-delay", "rank-pause"}
        assert s.heal_s is None and all(f.kind in FAULT_KINDS and f.start_s < 20 for f in s.faults)
        assert all(f.rank in (0, 1) for f in s.faults if f.kind == "rank-pause")
