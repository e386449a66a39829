"""The standard-mapping gamepad state -> evdev Xbox-360-like pad mapping (pure)."""

from __future__ import annotations

import math

import pytest

from streamer.desktop import padmap as pm


def test_neutral_state_is_all_released_and_centred() -> None:
    state = pm.map_state((), ())
    assert state == pm.neutral()
    assert set(v for v in state.values()) == {0}
    assert len(state) == len(pm.KEYS) + len(pm.ABS_RANGES)


@pytest.mark.parametrize(("index", "code"), [
    (0, pm.BTN_SOUTH), (1, pm.BTN_EAST), (2, pm.BTN_WEST), (3, pm.BTN_NORTH), (4, pm.BTN_TL), (5, pm.BTN_TR),
    (8, pm.BTN_SELECT), (9, pm.BTN_START), (10, pm.BTN_THUMBL), (11, pm.BTN_THUMBR), (16, pm.BTN_MODE),
])
def test_each_standard_button_presses_exactly_its_key(index: int, code: int) -> None:
    buttons = [0.0] * 17
    buttons[index] = 1.0
    state = pm.map_state((), buttons)
    assert pm.diff(pm.neutral(), state) == [(pm.EV_KEY, code, 1)]


def test_a_button_is_down_from_half_travel() -> None:
    assert pm.map_state((), [0.49])[(pm.EV_KEY, pm.BTN_SOUTH)] == 0
    assert pm.map_state((), [0.5])[(pm.EV_KEY, pm.BTN_SOUTH)] == 1


def test_triggers_are_analog_axes_z_and_rz() -> None:
    buttons = [0.0] * 8
    buttons[6], buttons[7] = 0.5, 1.0
    assert pm.diff(pm.neutral(), pm.map_state((), buttons)) == [(pm.EV_ABS, pm.ABS_Z, 128), (pm.EV_ABS, pm.ABS_RZ, 255)]


@pytest.mark.parametrize(("pressed", "hat_x", "hat_y"), [
    ({12}, 0, -1), ({13}, 0, 1), ({14}, -1, 0), ({15}, 1, 0), ({12, 15}, 1, -1), ({12, 13}, 0, 0), ({14, 15}, 0, 0),
])
def test_dpad_buttons_become_the_hat(pressed: set[int], hat_x: int, hat_y: int) -> None:
    buttons = [1.0 if i in pressed else 0.0 for i in range(17)]
    state = pm.map_state((), buttons)
    assert (state[(pm.EV_ABS, pm.ABS_HAT0X)], state[(pm.EV_ABS, pm.ABS_HAT0Y)]) == (hat_x, hat_y)
    assert all(state[(pm.EV_KEY, k)] == 0 for k in pm.KEYS)  # the d-pad is no key on an xpad pad


def test_sticks_map_to_x_y_rx_ry_with_full_range_and_clamping() -> None:
    state = pm.map_state((1.0, -1.0, -1.0, 1.0), ())
    assert state[(pm.EV_ABS, pm.ABS_X)] == pm.STICK_MAX and state[(pm.EV_ABS, pm.ABS_Y)] == pm.STICK_MIN
    assert state[(pm.EV_ABS, pm.ABS_RX)] == pm.STICK_MIN and state[(pm.EV_ABS, pm.ABS_RY)] == pm.STICK_MAX
    assert pm.map_state((7.0,), ())[(pm.EV_ABS, pm.ABS_X)] == pm.STICK_MAX  # clamped
    assert pm.map_state((), (0.0,) * 6 + (-3.0, 9.0))[(pm.EV_ABS, pm.ABS_RZ)] == 255
    axes_4_to_7 = pm.map_state((0, 0, 0, 0, 1, 1, 1, 1), ())
    assert axes_4_to_7 == pm.neutral()


def test_deadzone_reads_centre_and_rescales_outside() -> None:
    assert pm.stick(pm.DEADZONE) == 0 and pm.stick(-0.03) == 0
    just_out = pm.stick(pm.DEADZONE + 0.01)
    assert 0 < just_out < 0.02 * pm.STICK_MAX  # no jump at the dead zone's edge
    assert pm.stick(0.5, deadzone=0.0) == round(0.5 * pm.STICK_MAX)
    assert pm.stick(-0.5, deadzone=0.2) == -round((0.3 / 0.8) * 32768)
    for v in (-1.0, -0.7, -0.2, 0.0, 0.3, 1.0):
        lo, hi, _fuzz, _flat = pm.ABS_RANGES[pm.ABS_X]
        assert lo <= pm.stick(v) <= hi


def test_bad_input_raises_naming_the_entry() -> None:
    with pytest.raises(ValueError, match=r"axes\[1\]"):
        pm.map_state((0.0, math.nan), ())
    with pytest.raises(ValueError, match=r"buttons\[2\]"):
        pm.map_state((), (0.0, 0.0, math.inf))
    with pytest.raises(ValueError, match="deadzone"):
        pm.map_state((), (), deadzone=1.0)


def test_diff_lists_only_changes_keys_before_axes() -> None:
    a = pm.map_state((0.5,), (1.0,))
    b = pm.map_state((0.5,), (1.0, 1.0, 0, 0, 0, 0, 1.0))
    assert pm.diff(a, b) == [(pm.EV_KEY, pm.BTN_EAST, 1), (pm.EV_ABS, pm.ABS_Z, 255)]
    assert pm.diff(b, b) == []
    back = pm.diff(b, pm.neutral())
    assert [e[0] for e in back] == [pm.EV_KEY, pm.EV_KEY, pm.EV_ABS, pm.EV_ABS]
    assert all(value == 0 for _t, _c, value in back)
