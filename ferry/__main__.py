"""``python -m ferry`` is the ``ferry`` command.

A supervisor (``ferry up``, a benchmark, a test) sets ``FERRY_PARENT_PID`` so
that this process dies with it.
"""

import os
import sys

from ferry.process import die_with_parent

if os.environ.get("FERRY_PARENT_PID", "").isdigit():
    die_with_parent(int(os.environ.pop("FERRY_PARENT_PID")))

from ferry_cli.main import main

sys.exit(main())
