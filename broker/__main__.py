"""``python -m broker`` is ``render-broker``."""

import sys

from broker.cli import main

sys.exit(main())
