import sys

from opcheck.cli import main

sys.exit(main())
