"""`python -m gacc_callback try SCRIPT ...` when the helper is installed as a package."""

import sys

from gacc_callback import main

sys.exit(main(sys.argv[1:]))
