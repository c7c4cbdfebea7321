"""Where the main window goes (issue 37 item 16): the first size fits the screen's available area,
and a saved place that no longer fits is brought back on screen. Pure functions, no screen."""

from __future__ import annotations

from gaudi_gui.core import window_fit
from gaudi_gui.core.window_fit import FRAME, first_geometry, fit_saved, fits


def test_the_first_size_is_the_preferred_one_where_it_fits() -> None:
    x, y, w, h = first_geometry((0, 0, 1920, 1080))
    assert (w, h) == window_fit.PREFERRED
    assert fits((x, y, w, h), (0, 0, 1920, 1080))
    assert abs(x - (1920 - w) // 2) <= FRAME[0]  # centred


def test_the_first_size_fits_a_small_or_short_screen_with_its_frame() -> None:
    left, top, right, bottom = FRAME
    for available in ((0, 0, 1024, 700), (0, 0, 1280, 800), (0, 27, 1366, 741), (1920, 0, 1024, 768)):
        x, y, w, h = first_geometry(available)
        _x, _y, aw, ah = available
        # The frame (title bar above, borders around) is on the screen too.
        assert fits((x - left, y - top, w + left + right, h + top + bottom), available), available
        assert w == min(1280, aw - left - right) and h == min(860, ah - top - bottom)


def test_a_saved_place_is_kept_when_it_fits_and_brought_back_when_not() -> None:
    screen = (0, 0, 1024, 700)
    assert fit_saved((100, 80, 731, 533), screen) == (100, 80, 731, 533)
    # Saved on a larger screen: shrunk to fit, on screen.
    x, y, w, h = fit_saved((300, 200, 1280, 860), screen)
    assert fits((x, y, w, h), screen) and (w, h) == (1024 - 16, 700 - 40)
    # Saved on a monitor that is gone (right of this one): moved back, its size kept.
    x, y, w, h = fit_saved((2200, 100, 800, 600), screen)
    assert fits((x, y, w, h), screen) and (w, h) == (800, 600)
    # Above the top edge: the title bar comes back on screen.
    assert fit_saved((10, -50, 800, 600), screen)[1] == FRAME[1]
