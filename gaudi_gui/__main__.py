"""``python -m gaudi_gui``: the same entry point as the ``gaudi-gui`` console script."""

import sys

from gaudi_gui.cli import main

sys.exit(main())
