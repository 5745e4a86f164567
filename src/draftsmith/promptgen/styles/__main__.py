"""`python -m draftsmith.promptgen.styles`: the styles generator's command line."""

import sys

from draftsmith.promptgen.styles import main

if __name__ == "__main__":
    sys.exit(main())
