"""engine/sched/feedback.py: the share of the step bound's headroom, steered by the
walls of the steps beside critical calls (numbers in, numbers out: nothing timed)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corps.engine.sched.feedback import ERROR_CLIP, MIN_ALONE, StepFeedback


def measured(fb: StepFeedback, *walls: float) -> StepFeedback:
    for wall in walls:
        fb.observe(wall, alone=True)
    return fb


def test_it_probes_until_the_step_alone_is_measured_and_nothing_moves_before():
    fb = StepFeedback()
    assert fb.share == 0.0 and fb.alone() is None and fb.probe()
    fb.observe(0.050, alone=False)  # no reference: the share stays closed
    assert fb.share == 0.0
    measured(fb, *[0.026] * (MIN_ALONE - 1))
    assert fb.alone() is None and fb.probe()
    measured(fb, 0.026)
    assert fb.alone() == pytest.approx(0.026) and not fb.probe()


def test_the_reference_is_the_median_step_alone():
    """26, 27, and a 40-ms stall: the reference is 27."""
    fb = measured(StepFeedback(), 0.026, 0.027, 0.040)
    assert fb.alone() == pytest.approx(0.027)
    fb.observe(-1.0, alone=True)  # nonsense is ignored
    assert fb.alone() == pytest.approx(0.027)


def test_it_probes_again_every_probe_every_steps():
    fb = measured(StepFeedback(probe_every=4), 0.03, 0.03, 0.03)
    for _ in range(3):
        fb.observe(0.039, alone=False)
        assert not fb.probe()
    fb.observe(0.039, alone=False)
    assert fb.probe()  # four steps beside: measure again
    measured(fb, 0.03)
    assert not fb.probe()


def test_steps_over_the_target_close_the_share_and_steps_under_it_open_it():
    fb = measured(StepFeedback(target=1.3, gain=0.2), 0.030, 0.030, 0.030)
    fb.share = 1.0
    for _ in range(20):  # 1.6x the step alone: 0.3 over, 0.06 a step
        fb.observe(0.048, alone=False)
    assert fb.share == 0.0
    for _ in range(3):  # alone: 0.3 under, it opens again
        fb.observe(0.030, alone=False)
    assert fb.share == pytest.approx(0.18)
    fb.observe(0.039, alone=False)  # on target: stays
    assert fb.share == pytest.approx(0.18)


def test_one_stalled_step_moves_the_share_by_a_clipped_amount():
    fb = measured(StepFeedback(target=1.3, gain=0.2), 0.030, 0.030, 0.030)
    fb.share = 1.0
    fb.observe(10.0, alone=False)  # a 10-s stall
    assert fb.share == pytest.approx(1.0 - 0.2 * ERROR_CLIP)


def test_reset_forgets_the_reference_and_closes_the_share():
    fb = measured(StepFeedback(), 0.03, 0.03, 0.03)
    fb.share = 0.7
    fb.reset()
    assert fb.share == 0.0 and fb.alone() is None and fb.probe()


@given(st.lists(st.floats(1e-4, 1.0), max_size=60), st.floats(1.0, 2.0))
def test_the_share_stays_between_zero_and_one(walls, target):
    fb = measured(StepFeedback(target=target), 0.03, 0.03, 0.03)
    for wall in walls:
        fb.observe(wall, alone=False)
        assert 0.0 <= fb.share <= 1.0


def test_under_steady_walls_the_share_settles_where_they_meet_the_target():
    """A plant: a step beside critical calls takes (1 + share) x the step alone. The
    controller settles at share 0.3, walls at 1.3x."""
    fb = measured(StepFeedback(target=1.3, probe_every=10_000), 0.030, 0.030, 0.030)
    for _ in range(200):
        fb.observe(0.030 * (1 + fb.share), alone=False)
    assert fb.share == pytest.approx(0.3, abs=1e-3)
