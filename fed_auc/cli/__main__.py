"""``python -m fed_auc.cli``: the ``fed-auc`` command."""

import sys

from fed_auc.cli import main

sys.exit(main())
