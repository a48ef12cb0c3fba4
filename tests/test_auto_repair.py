"""engine/auto_repair.py: the ladder moves up at once on a high gap, down after a calm
streak, and back up (with doubled patience) when the lower rung fails at once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from corps.engine.auto_repair import HIGH, LADDER, LOW, PATIENCE, AutoRepair

HI, LO, MID = 2 * HIGH, LOW / 2, (LOW + HIGH) / 2


def rungs(auto: AutoRepair, gaps, key=("w", "a")) -> list[str]:
    out = []
    for g in gaps:
        auto.observe(*key, g)
        out.append(str(auto.policy(*key)))
    return out


def test_it_starts_cheapest_and_moves_up_one_rung_per_high_audit():
    auto = AutoRepair()
    assert str(auto.policy("w", "a")) == "none"
    got = rungs(auto, [HI] * len(LADDER))
    assert got == [str(p) for p in LADDER[1:]] + [str(LADDER[-1])]  # the top holds


def test_a_gap_inside_the_band_moves_nothing():
    auto = AutoRepair()
    rungs(auto, [HI])
    assert rungs(auto, [MID] * 20) == [str(LADDER[1])] * 20


def test_down_after_patience_calm_audits_and_back_up_with_doubled_patience():
    auto = AutoRepair()
    rungs(auto, [HI, HI])  # rung 2
    calm = rungs(auto, [LO] * PATIENCE)
    assert calm[-1] == str(LADDER[1]) and calm[:-1] == [str(LADDER[2])] * (PATIENCE - 1)
    switch = auto.observe("w", "a", HI)  # the lower rung fails at once
    assert switch.why == "fell back" and switch.after == str(LADDER[2])
    again = rungs(auto, [LO] * (2 * PATIENCE))  # twice as long before it tries again
    assert again[2 * PATIENCE - 2] == str(LADDER[2]) and again[-1] == str(LADDER[1])


def test_keys_move_apart():
    auto = AutoRepair()
    auto.observe("tot", "voter", HI)
    assert str(auto.policy("tot", "voter")) == str(LADDER[1])
    assert str(auto.policy("tot", "solver")) == "none"
    assert auto.chosen() == {("tot", "voter"): str(LADDER[1])}


@given(st.lists(st.floats(min_value=0.0, max_value=1.0), max_size=200))
def test_it_never_leaves_the_ladder_and_each_switch_is_one_rung_for_its_reason(gaps):
    auto = AutoRepair()
    names = [str(p) for p in LADDER]
    rung = 0
    for g in gaps:
        s = auto.observe("w", "a", g)
        now = names.index(str(auto.policy("w", "a")))
        if s is None:
            assert now == rung
        else:
            assert abs(now - rung) == 1 and s.before == names[rung] and s.after == names[now]
            assert (s.why == "low") == (now < rung)
            assert s.why != "low" or g < LOW
        rung = now


def test_a_key_not_seen_yet_starts_where_its_call_says():
    """A call under "auto:P" starts its key at rung P (a pattern's decision steps start
    where their default repair is); a key already on the ladder stays where it is, and
    the start never changes how it moves."""
    auto, start = AutoRepair(), LADDER[3]
    assert auto.policy("w", "voter", start) == start
    assert auto.policy("w", "voter") == start  # remembered
    assert auto.chosen() == {("w", "voter"): str(start)}
    auto.observe("w", "other", HI)  # on the ladder, at rung 1
    assert auto.policy("w", "other", start) == LADDER[1]  # the start is ignored
    assert rungs(auto, [HI], key=("w", "voter")) == [str(LADDER[4])]
