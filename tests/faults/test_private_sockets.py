"""The fd-passing socket of the GPU transports (comms.cuda.vmm.FdBroker) is private to the job's user: its folder
is mode 0700, and a process that reaches the socket anyway is refused by its peer credentials (SO_PEERCRED) when it
belongs to another user or is not a rank of the node. Run on the CPU in a subprocess against a stand-in
``cuda.bindings.driver`` (the broker itself makes no CUDA call); the other user is 'nobody', made by setuid, so the
test needs root and skips otherwise."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

FAKE_DRIVER = '''
class _Any(int):
    def __getattr__(self, name):
        return _Any(0)

    def __call__(self, *a, **k):
        return _Any(0)


def __getattr__(name):
    return _Any(0)
'''

SCRIPT = r'''
import json, os, socket, stat, sys, time
from comms.cuda.vmm import FdBroker
from comms.grid import CommsError, _SingleComm

NOBODY = 65534
b = FdBroker(_SingleComm(), 5.0)
out = {"mode": oct(stat.S_IMODE(os.stat(b.dir).st_mode)), "owner": os.stat(b.dir).st_uid}


def child(uid):
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            if uid is not None:
                os.setgid(NOBODY)
                os.setuid(uid)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(b.path)
            time.sleep(1.0)
        except PermissionError:
            code = 10
        except Exception:
            code = 11
        os._exit(code)
    return pid


def refused(uid):
    pid = child(uid)
    conn, _ = b.srv.accept()
    try:
        b._check(conn)
        why = None
    except CommsError as e:
        why = str(e)
    conn.close()
    os.waitpid(pid, 0)
    return why

pid = child(NOBODY)                                  # another user cannot even reach the socket
out["other_user_at_folder"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
os.chmod(b.dir, 0o755)                               # open the folder on purpose: the credentials still refuse
os.chmod(b.path, 0o777)
out["other_user_at_socket"] = refused(NOBODY)
out["not_a_rank"] = refused(None)
b.close()
print(json.dumps(out))
'''


def test_fd_broker_refuses_other_users_and_strangers(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("making another user's process needs root (setuid to nobody)")
    fake = tmp_path / "fake" / "cuda" / "bindings"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "driver.py").write_text(FAKE_DRIVER)
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{fake.parent.parent}")
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["mode"] == "0o700" and out["owner"] == os.getuid()
    assert out["other_user_at_folder"] == 10                 # EACCES at the 0700 folder
    assert "belongs to user 65534" in out["other_user_at_socket"] and "refused" in out["other_user_at_socket"]
    assert "is not a rank of this node" in out["not_a_rank"]
