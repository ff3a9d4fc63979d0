"""``python -m ferry`` is the ``ferry`` command."""

import sys

from ferry.cli.main import main

sys.exit(main())
