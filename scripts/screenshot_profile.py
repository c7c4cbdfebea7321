"""``python scripts/screenshot_profile.py RUN_FOLDER [OUT.png] [WxH]``: a profiled run's Profile… page
(issue 40) as the window shows it, grabbed offscreen (default OUT: docs/screens/profile-900x600.png).

RUN_FOLDER is a real run made with ``gaudi-gui train --profile-steps N`` (its ``profile/`` folder)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from shot import parse_size


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    folder = Path(argv[0])
    out = Path(argv[1]) if len(argv) > 1 else Path("docs/screens/profile-900x600.png")
    width, height = parse_size(argv[2] if len(argv) > 2 else "900x600", "screenshot_profile.py")
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    from gaudi_gui.ui.profile_view import ProfileView
    app = QApplication([])
    view = ProfileView()
    if not view.show_run(folder):
        print(f"screenshot_profile.py: {folder} has no profile", file=sys.stderr)
        return 2
    view.resize(width, height)
    view.show()
    app.processEvents()
    out.parent.mkdir(parents=True, exist_ok=True)
    view.grab().save(str(out))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
