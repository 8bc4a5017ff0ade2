"""``python -m bubo``: the same as the ``bubo`` command."""

from bubo.cli import main

raise SystemExit(main())
