"""`python -m draftsmith`: the `draftsmith` command."""

from draftsmith.cli import main

raise SystemExit(main())
