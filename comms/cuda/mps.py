"""Several ranks on one GPU: start and stop the CUDA MPS control daemon (docs/halo-protocol.md, "Several ranks on one GPU").

``python -m comms.cuda.mps run -- CMD ...`` starts MPS with its pipe and log directories in a new private temporary
folder, runs CMD with CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY set (so that its CUDA processes become MPS
clients), stops MPS (``echo quit | nvidia-cuda-mps-control``) and prints one line saying whether MPS ran, with the
server's process ids as the control daemon listed them while CMD ran.

The caller must not have created a CUDA context before starting MPS; the pipe directory is private, so other CUDA
processes of the machine are not MPS clients.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

from ..config import child_env


class Mps:
    """Context manager: ``with Mps() as m: env = m.env()``; ``m.ran`` / ``m.why`` / ``m.servers``."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.ran = False
        self.why = "not asked for"
        self.dir = None
        self.servers = ""
        self.vars = {}

    def _control(self, text: str, timeout=20) -> str:
        env = child_env(self.vars)
        r = subprocess.run(["nvidia-cuda-mps-control"], input=text + "\n", capture_output=True, text=True,
                           env=env, timeout=timeout)
        return (r.stdout + r.stderr).strip()

    def start(self):
        if not self.enabled:
            return self
        exe = shutil.which("nvidia-cuda-mps-control")
        if exe is None:
            self.why = "nvidia-cuda-mps-control is not on PATH"
            return self
        self.dir = tempfile.mkdtemp(prefix="hmc-mps-")
        self.vars = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(self.dir, "pipe"),
                     "CUDA_MPS_LOG_DIRECTORY": os.path.join(self.dir, "log")}
        for d in self.vars.values():
            os.makedirs(d, mode=0o700)
        r = subprocess.run([exe, "-d"], env=child_env(self.vars), capture_output=True, text=True,
                           timeout=30)
        if r.returncode != 0:
            self.why = f"nvidia-cuda-mps-control -d exited {r.returncode}: {(r.stdout + r.stderr).strip()[:200]}"
            self.vars = {}
            return self
        for _ in range(100):
            if os.path.exists(os.path.join(self.vars["CUDA_MPS_PIPE_DIRECTORY"], "control")):
                break
            time.sleep(0.05)
        self.ran = True
        self.why = f"control daemon started (pipe {self.vars['CUDA_MPS_PIPE_DIRECTORY']})"
        return self

    def env(self, base=None) -> dict:
        """The environment of an MPS client: ``base`` (default: this process's) with MPS's variables."""
        if base is None:
            return child_env(self.vars)
        env = dict(base)
        env.update(self.vars)
        return env

    def poll_servers(self) -> str:
        if self.ran:
            try:
                s = self._control("get_server_list", timeout=10)
            except Exception as e:  # noqa: BLE001
                s = f"(get_server_list failed: {e})"
            if s:
                self.servers = s
        return self.servers

    def log_tail(self, n=5) -> str:
        if not self.dir:
            return ""
        p = os.path.join(self.dir, "log", "control.log")
        try:
            with open(p) as f:
                return "".join(f.readlines()[-n:]).strip()
        except OSError:
            return ""

    def stop(self):
        if self.ran:
            try:
                self._control("quit", timeout=30)
            except Exception:  # noqa: BLE001
                pass
            time.sleep(0.2)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def line(self) -> str:
        if not self.enabled:
            return "mps: not used"
        if not self.ran:
            return f"mps: did not run ({self.why})"
        return f"mps: ran ({self.why}; servers seen: {self.servers.split() if self.servers else 'none listed'})"

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "run" or "--" not in argv:
        print("usage: python -m comms.cuda.mps run [--no-mps] -- CMD ...", file=sys.stderr)
        return 2
    use = "--no-mps" not in argv[:argv.index("--")]
    cmd = argv[argv.index("--") + 1:]
    with Mps(use) as m:
        print(m.line() if not m.ran else f"mps: started ({m.why})", flush=True)
        p = subprocess.Popen(cmd, env=m.env())
        while p.poll() is None:
            m.poll_servers()
            try:
                p.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        rc = p.returncode
        if m.ran and not m.servers:
            m.poll_servers()
        print(m.line(), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
