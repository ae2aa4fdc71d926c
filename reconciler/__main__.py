import gc
import os
import sys

# Importing a command builds tens of thousands of objects (modules, classes, functions) and no
# garbage: the cyclic collector would only walk them, several times over. It runs again from the
# first line of the command on, and never walks these again (freeze: the daemon lives for months).
gc.disable()
from reconciler import commands  # noqa: E402
from reconciler.cli import main  # noqa: E402
from reconciler.constants import Exit  # noqa: E402

gc.freeze()
gc.enable()
commands.exit_without_teardown()
code = main()
if commands.left_to_exit():
    # A one-shot command left its values to the exit (reconciler/commands/__init__.py): the
    # streams are flushed, and the OS frees the rest at once.
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # the reader left (`| head`): nothing more to say, as cli.main has it
        code = Exit.BROKEN_PIPE
    os._exit(code)
sys.exit(code)
