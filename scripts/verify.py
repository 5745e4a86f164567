"""Re-hash artifacts against their manifests (logic: draftsmith.verify)."""

import sys

from draftsmith.verify import main

sys.exit(main())
