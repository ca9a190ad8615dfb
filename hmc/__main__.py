import os
import signal
import sys

_interrupts = []


def _note_interrupt(signum, frame):
    _interrupts.append(signum)


try:
    # Ctrl-C while Python loads the modules is noted and acted on once they are loaded: a KeyboardInterrupt inside
    # a C extension's import (NumPy's) comes out as an ImportError with a traceback
    signal.signal(signal.SIGINT, _note_interrupt)
    from . import guard
    from .cli import main
    signal.signal(signal.SIGINT, signal.default_int_handler)
except KeyboardInterrupt:                 # one that came before the handler: no traceback either
    _interrupts.append(signal.SIGINT)
if _interrupts:
    print("hmc: interrupted", file=sys.stderr, flush=True)
    os._exit(130)

code = main()


def _end_now(signum, frame):
    # the work is done and saved: a Ctrl-C or SIGTERM during the interpreter's teardown (atexit, logging's
    # shutdown, MPI_Finalize) ends it at once with the work's status, instead of a KeyboardInterrupt traceback
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


for _sig in (signal.SIGINT, signal.SIGTERM):
    if signal.getsignal(_sig) is not signal.SIG_IGN:
        signal.signal(_sig, _end_now)
if guard.failed_hdf5_write:
    # libhdf5 keeps the objects of a file whose write failed and can crash closing them at interpreter exit
    # (SIGSEGV after the one-line error): the run file is safe by now, so skip the teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
sys.exit(code)
