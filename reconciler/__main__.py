import gc
import sys

# Importing a command builds tens of thousands of objects (modules, classes, functions) and no
# garbage: the cyclic collector would only walk them, several times over. It runs again from the
# first line of the command on, and never walks these again (freeze: the daemon lives for months).
gc.disable()
from reconciler.cli import main  # noqa: E402

gc.freeze()
gc.enable()
sys.exit(main())
