import os
import sys

try:
    from . import guard
    from .cli import main
except KeyboardInterrupt:                 # Ctrl-C while Python loads the modules: no traceback either
    print("hmc: interrupted", file=sys.stderr, flush=True)
    os._exit(130)

code = main()
if guard.failed_hdf5_write:
    # libhdf5 keeps the objects of a file whose write failed and can crash closing them at interpreter exit
    # (SIGSEGV after the one-line error): the run file is safe by now, so skip the teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
sys.exit(code)
