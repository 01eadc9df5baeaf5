"""``python -m mgpu_edu``: the same as the ``mgpu-edu`` command."""

import sys

from mgpu_edu.course.cli import main

sys.exit(main())
