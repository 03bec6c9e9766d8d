"""``python -m stampede``: the command line (``stampede.cli``)."""

from .cli import main

raise SystemExit(main())
