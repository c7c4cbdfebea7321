"""Where the main window goes on a screen: its first size, and a saved place that no longer fits.

The window opened at 1280x860 whatever the screen: on a 1024x700 screen (or any 800 px high) Health,
"Pick healthy & free" and the status bar were below its edge. The first size is the preferred one
bounded by the screen's available area (``QScreen.availableGeometry``: without panels and docks), less
room for the window manager's frame, and centred there. A saved geometry is kept as it was while it
fits the available area; one that no longer does (a smaller screen, a monitor gone) is shrunk to fit
and moved back on screen.

Pure functions of rectangles ``(x, y, width, height)`` so they test without a screen. Qt-free.
"""

from __future__ import annotations

#: (x, y, width, height)
Rect = tuple[int, int, int, int]
#: The first size where the screen has room for it.
PREFERRED = (1280, 860)
#: Room the window manager's frame takes around the window's own geometry: left, top (the title
#: bar), right, bottom. The geometry Qt sets is the inside of the frame.
FRAME = (8, 32, 8, 8)


def _inside(available: Rect, frame: tuple[int, int, int, int]) -> Rect:
    """The area a window's own geometry may take in ``available`` with its frame around it."""
    x, y, w, h = available
    left, top, right, bottom = frame
    return x + left, y + top, max(1, w - left - right), max(1, h - top - bottom)


def first_geometry(available: Rect, preferred: tuple[int, int] = PREFERRED,
                   frame: tuple[int, int, int, int] = FRAME) -> Rect:
    """The window's first geometry: ``preferred`` bounded by the available area (its frame
    included), centred in it."""
    x, y, w, h = _inside(available, frame)
    width, height = min(preferred[0], w), min(preferred[1], h)
    return x + (w - width) // 2, y + (h - height) // 2, width, height


def fits(rect: Rect, available: Rect) -> bool:
    """Whether ``rect`` lies wholly in ``available``."""
    x, y, w, h = rect
    ax, ay, aw, ah = available
    return x >= ax and y >= ay and x + w <= ax + aw and y + h <= ay + ah


def fit_saved(saved: Rect, available: Rect, frame: tuple[int, int, int, int] = FRAME) -> Rect:
    """A saved geometry as it was when it fits the available area with its frame; else its size
    bounded by the area (the frame included) and its place moved the least that brings it wholly on
    screen."""
    left, top, right, bottom = frame
    x, y, w, h = saved
    if fits((x - left, y - top, w + left + right, h + top + bottom), available):
        return saved
    ix, iy, iw, ih = _inside(available, frame)
    width, height = min(max(1, w), iw), min(max(1, h), ih)
    x = min(max(x, ix), ix + iw - width)
    y = min(max(y, iy), iy + ih - height)
    return x, y, width, height


__all__ = ["FRAME", "PREFERRED", "Rect", "first_geometry", "fit_saved", "fits"]
