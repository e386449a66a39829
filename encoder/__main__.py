"""``python -m encoder``: print the encoder probe table (see ``encoder.cli``)."""

from encoder.cli import main

raise SystemExit(main())
