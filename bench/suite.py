"""``hmc bench suite [NAME] [--dry-run] [--set VAR=VALUE ...] [--out DIR] [--steps PATTERNS]``: run one named
device suite of ``bench/suites.toml`` step by step, printing each step (its command, environment, limits) and its
result; without NAME, list the suites. ``--dry-run`` prints the steps and runs nothing (a check on any machine).

The file holds ``[suites.NAME]`` tables. A suite has ``description``; ``out`` (its results folder, ``{out}`` in
the steps; ``--out`` replaces it); ``vars`` (substituted as ``{name}`` in commands, step names, environment values,
paths and later vars; ``--set`` replaces them; ``budget``: the seconds the whole suite may take, see ``min_left``);
``env`` and ``unset`` (the environment of every step); ``env_if_exists`` (``VAR = "path"``: set to the absolute
path when it exists); ``log`` (the runner's progress lines appended to this file under ``{out}`` too); and
``steps``.

A step is one of

* a command: ``run`` (a string split like a shell line, without pipes or redirections, or a list of arguments),
  with ``name``; ``ranks`` (run under ``mpiexec --oversubscribe -n RANKS``); ``mps`` (the CUDA MPS daemon of
  :mod:`comms.cuda.mps` serves it: consecutive MPS steps share one daemon, stopped before the next step without
  MPS); ``env`` / ``unset``; ``timeout`` (seconds; ``signal`` "INT" or "TERM", the default; the group is killed
  20 s later; exit status 124); ``log`` (stdout and stderr appended to this file, relative to ``{out}``; default
  the console); ``stdout`` (stdout alone written to this file); ``tail`` (print the log's last lines);
  ``optional`` (its failure does not fail the suite); ``mkdir`` (folders made first); ``resume_if`` (``[path,
  arg...]``: the arguments are appended when the path exists);
* ``suite = "OTHER"``: that suite's steps in its place, with ``set`` (its variables) and ``out`` (its folder);
* ``archive = [folder, file]`` (relative to ``{out}``): the folder packed into a gzipped tar file (its entries at
  the top, or under the folder's name with ``as_folder = true``; ``exclude``: glob patterns left out), then removed
  unless ``keep = true``.

Any step may have ``when`` (``"ok:NAME"`` / ``"failed:NAME"``: only after that earlier step succeeded / failed;
``"set:{var}"``: only when the value is not empty), ``skip_if_exists`` (a path), ``min_gpus`` (GPUs that
``nvidia-smi -L`` lists, or the variable ``ngpu``) and ``min_left`` (seconds of the suite's ``budget`` that must be
left; a timeout is also capped at what is left, and ``{budget_left}`` in a command is what is left less 10 s when the
step starts). ``foreach`` (a table of lists, or of strings split at spaces) repeats a step for every combination,
``rows`` (a list of tables) for every row. Known everywhere: ``{python}`` (this interpreter, or ``--python``) and
``{root}`` (the checkout, where the commands run). Exit status 0 when no non-optional step failed, else 1.
"""
from __future__ import annotations

import fnmatch
import itertools
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from comms.config import child_env

ROOT = Path(__file__).resolve().parents[1]
SUITES = Path(__file__).with_name("suites.toml")
STEP_KEYS = {"name", "run", "ranks", "mps", "env", "unset", "timeout", "signal", "log", "stdout", "tail", "optional",
             "mkdir", "resume_if", "suite", "set", "out", "archive", "as_folder", "exclude", "keep", "when",
             "skip_if_exists", "min_gpus", "min_left", "foreach", "rows"}
RUNTIME = "{budget_left}"


class SuiteError(ValueError):
    """A suites file, suite or step that cannot be run (one line)."""


def load(path=None) -> dict:
    path = Path(path) if path else SUITES
    try:
        return tomllib.loads(path.read_text()).get("suites", {})
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SuiteError(f"cannot read the suites file {path}: {e}") from None


def _fmt(text, values: dict) -> str:
    try:
        return str(text).format(**values)
    except (KeyError, IndexError, ValueError) as e:
        raise SuiteError(f"placeholder {e} in {text!r}: define it in the suite's vars (or escape braces as {{{{ }}}})"
                         ) from None


def _flag(v, values) -> bool:
    return v if isinstance(v, bool) else _fmt(v, values).strip().lower() in ("1", "true", "yes", "on")


def _expand(step: dict, values: dict) -> list[dict]:
    """The step's values once per combination of its ``foreach`` lists and per row of its ``rows``."""
    fe = step.get("foreach", {})
    lists = [_fmt(v, values).split() if isinstance(v, str) else [str(x) for x in v] for v in fe.values()]
    combos = [dict(zip(fe, c)) for c in itertools.product(*lists)]
    rows = step.get("rows") or [{}]
    return [{**values, **c, **{k: _fmt(x, values) for k, x in r.items()}} for c in combos for r in rows]


@dataclass
class Budget:
    """Seconds a suite may take, counted from its first step that runs."""
    seconds: float
    start: float | None = None

    def left(self) -> float:
        if self.start is None:
            self.start = time.monotonic()
        return self.seconds - (time.monotonic() - self.start)


@dataclass
class Step:
    name: str
    argv: list
    env: dict
    unset: list
    spec: dict
    values: dict
    budget: Budget | None

    @property
    def out(self) -> Path:
        return Path(self.values["out"])

    def path(self, key) -> Path | None:
        return self.out / _fmt(self.spec[key], self.values) if self.spec.get(key) else None


@dataclass
class Runner:
    suites: dict
    python: str = sys.executable
    dry_run: bool = False
    results: dict = field(default_factory=dict)
    mps: object = None
    failed: int = 0
    log: Path | None = None

    def say(self, text: str):
        """A progress line on the console, and in the suite's log when it has one."""
        print(text, flush=True)
        if self.log is not None and not self.dry_run:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log, "a") as f:
                f.write(text + "\n")

    def values(self, name: str, overrides: dict, out=None) -> dict:
        """The placeholders of suite ``name``: its vars, then ``overrides``, then ``out``."""
        if name not in self.suites:
            raise SuiteError(f"no suite {name!r}: use one of {', '.join(sorted(self.suites))}")
        s = self.suites[name]
        values = {"python": self.python, "root": str(ROOT), "budget_left": RUNTIME}
        for k, v in s.get("vars", {}).items():          # in order: a variable may use those before it
            values[k] = _fmt(v, values)
        values.update(overrides)
        values["out"] = _fmt(out or s.get("out", "/tmp/out"), values)
        return values

    def plan(self, name: str, overrides: dict, out=None) -> list[Step]:
        """Every step of suite ``name``: included suites inline, ``foreach`` and ``rows`` expanded."""
        values = self.values(name, overrides, out)
        s = self.suites[name]
        budget = Budget(float(values["budget"])) if values.get("budget") else None
        env = {k: _fmt(v, values) for k, v in s.get("env", {}).items()}
        for k, p in s.get("env_if_exists", {}).items():
            if Path(_fmt(p, values)).exists():
                env[k] = str(Path(_fmt(p, values)).resolve())
        steps = []
        for raw in s.get("steps", []):
            bad = set(raw) - STEP_KEYS
            if bad:
                raise SuiteError(f"suite {name!r}: unknown step keys {sorted(bad)}; known: {sorted(STEP_KEYS)}")
            for v in _expand(raw, values):
                if "suite" in raw:
                    sub = {k: _fmt(x, v) for k, x in raw.get("set", {}).items()}
                    inner = self.plan(raw["suite"], {**overrides, **sub}, raw.get("out") and _fmt(raw["out"], v))
                    for st in inner:
                        st.env = {**env, **st.env}
                        st.unset = s.get("unset", []) + st.unset
                    steps += inner
                else:
                    steps.append(self._step(raw, v, env, s.get("unset", []), budget))
        return steps

    def _step(self, raw, v, env, unset, budget) -> Step:
        if "archive" in raw:
            src, dst = (str(Path(v["out"]) / _fmt(a, v)) for a in raw["archive"])
            return Step(_fmt(raw.get("name", f"archive {src} -> {dst}"), v), ["pack", src, dst], {}, [], raw, v, budget)
        if "run" not in raw:
            raise SuiteError(f"a step needs run, suite or archive: {raw}")
        run = raw["run"]
        argv = [_fmt(a, v) for a in run] if isinstance(run, list) else shlex.split(_fmt(run, v))
        if raw.get("ranks"):
            argv = ["mpiexec", "--oversubscribe", "-n", _fmt(raw["ranks"], v)] + argv
        senv = {**env, **{k: _fmt(x, v) for k, x in raw.get("env", {}).items()}}
        return Step(_fmt(raw.get("name", shlex.join(argv[:4])), v), argv, senv, list(unset) + raw.get("unset", []),
                    raw, v, budget)

    # --- one step ----------------------------------------------------------------------------------------------
    def skip_reason(self, st: Step) -> str | None:
        cond = _fmt(st.spec.get("when", ""), st.values)
        kind, _, what = cond.partition(":")
        if kind == "set" and not what.strip():
            return "its variable is empty"
        if kind in ("ok", "failed"):
            rc = self.results.get(what)
            if rc is None or (rc == 0) != (kind == "ok"):
                return f"only when {what!r} {'succeeded' if kind == 'ok' else 'failed'}"
        p = st.spec.get("skip_if_exists")
        if p and Path(_fmt(p, st.values)).exists():
            return f"{_fmt(p, st.values)} exists"
        need = st.spec.get("min_gpus")
        if need and gpu_count(st.values) < int(_fmt(need, st.values)):
            return f"needs {_fmt(need, st.values)} GPUs, this machine has {gpu_count(st.values)}"
        left = st.budget.left() if st.budget else None
        if left is not None and st.spec.get("min_left") and left < float(st.spec["min_left"]):
            return f"only {left:.0f} s of the suite's budget left"
        return None

    def argv(self, st: Step) -> list:
        argv = list(st.argv)
        r = st.spec.get("resume_if")
        if r and Path(_fmt(r[0], st.values)).exists():
            argv += [_fmt(a, st.values) for a in r[1:]]
        if st.budget is not None and not self.dry_run:
            argv = [a.replace(RUNTIME, str(int(st.budget.left() - 10))) for a in argv]
        return argv

    def timeout(self, st: Step) -> float | None:
        t = float(_fmt(st.spec["timeout"], st.values)) if st.spec.get("timeout") else None
        if st.budget is not None and not self.dry_run:
            cap = max(1.0, st.budget.left() - 5)
            t = cap if t is None else min(t, cap)
        return t

    def describe(self, i, n, st: Step) -> str:
        lines = [f"[{i}/{n}] {st.name}"]
        inherited = child_env()
        extra = {k: v for k, v in st.env.items() if inherited.get(k) != v}
        if extra:
            lines.append("    env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(extra.items())))
        if st.unset:
            lines.append("    unset " + " ".join(st.unset))
        lines.append("    $ " + shlex.join(self.argv(st)))
        t = self.timeout(st)
        info = [f"timeout {t:.0f} s" if t else "no timeout", "MPS" if _flag(st.spec.get("mps", False), st.values)
                else "no MPS", f"out {st.out}"]
        info += [f"{k} {st.path(k)}" for k in ("log", "stdout") if st.spec.get(k)]
        info += [f"{k} {_fmt(st.spec[k], st.values)}" for k in ("when", "skip_if_exists", "min_gpus", "min_left")
                 if st.spec.get(k)]
        if st.budget is not None:
            info.append(f"suite budget {st.budget.seconds:.0f} s")
        lines.append("    " + ", ".join(info))
        return "\n".join(lines)

    def set_mps(self, on: bool):
        if on and self.mps is None:
            from comms.cuda.mps import Mps

            self.mps = Mps(True).start()
            self.say(f"    {self.mps.line()}")
        elif not on and self.mps is not None:
            self.mps.poll_servers()
            self.say(f"    {self.mps.line()}; stopped")
            self.mps.stop()
            self.mps = None

    def execute(self, st: Step) -> int:
        st.out.mkdir(parents=True, exist_ok=True)
        if "archive" in st.spec:
            if not Path(st.argv[1]).is_dir():
                self.say(f"    nothing to pack: {st.argv[1]} is not a folder")
                return 1
            return pack(Path(st.argv[1]), Path(st.argv[2]), st.spec)
        for d in st.spec.get("mkdir", []):
            Path(_fmt(d, st.values)).mkdir(parents=True, exist_ok=True)
        env = child_env()                       # this process's environment, less the step's unset, plus its env
        for k in st.unset:
            env.pop(k, None)
        env.update(st.env)
        if self.mps is not None:
            env.update(self.mps.vars)
        sig = signal.SIGINT if st.spec.get("signal") == "INT" else signal.SIGTERM
        with _open(st.path("log"), "a") as lf, _open(st.path("stdout"), "w") as of:
            try:
                p = subprocess.Popen(self.argv(st), env=env, cwd=ROOT, stdout=of or lf, stderr=lf,
                                     start_new_session=True)
            except OSError as e:
                self.say(f"    cannot start: {e}")
                return 127
            return _wait(p, self.timeout(st), sig)

    # --- the suite ---------------------------------------------------------------------------------------------
    def run(self, steps: list[Step]) -> int:
        n = len(steps)
        for i, st in enumerate(steps, 1):
            self.say(self.describe(i, n, st))
            if self.dry_run:
                continue
            why = self.skip_reason(st)
            if why:
                self.say(f"    skipped: {why}")
                continue
            if "archive" not in st.spec:
                self.set_mps(_flag(st.spec.get("mps", False), st.values))
            t0 = time.monotonic()
            rc = self.execute(st)
            self.results[st.name] = rc
            if rc != 0 and not st.spec.get("optional"):
                self.failed += 1
            if st.spec.get("tail") and st.path("log"):
                self.say(_tail(st.path("log"), int(st.spec["tail"])))
            note = " (timed out)" if rc == 124 else ""
            note += " (optional)" if rc and st.spec.get("optional") else ""
            self.say(f"    rc={rc}{note} in {time.monotonic() - t0:.1f} s")
        self.set_mps(False)
        return 1 if self.failed else 0


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _open(path, mode):
    if path is None:
        return _Null()
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, mode)


def _wait(p, timeout, sig) -> int:
    """The command's exit status; 124 when it ran past ``timeout`` (``sig`` to its group, SIGKILL 20 s later)."""
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, sig)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        return 124


def _tail(path: Path, n: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def gpu_count(values: dict) -> int:
    """``ngpu`` of the suite's variables when set, else the GPUs that nvidia-smi lists (0 without it)."""
    if values.get("ngpu"):
        return int(values["ngpu"])
    if shutil.which("nvidia-smi") is None:
        return 0
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    return sum(1 for line in r.stdout.splitlines() if line.startswith("GPU"))


def pack(src: Path, dst: Path, spec: dict) -> int:
    """``src`` (a folder) into the gzipped tar ``dst`` (see the module docstring: as_folder, exclude, keep)."""
    skip = spec.get("exclude", [])

    def keep(info):
        return None if any(fnmatch.fnmatch(Path(info.name).name, g) for g in skip) else info

    with tarfile.open(dst, "w:gz") as t:
        if spec.get("as_folder"):
            t.add(src, arcname=src.name, filter=keep)
        else:
            for p in sorted(src.iterdir()):
                if p != dst:
                    t.add(p, arcname=p.name, filter=keep)
    if not spec.get("keep"):
        shutil.rmtree(src)
    return 0


def _overrides(pairs) -> dict:
    out = {}
    for p in pairs or []:
        k, eq, v = p.partition("=")
        if not eq or not k:
            raise SuiteError(f"--set {p!r}: give NAME=VALUE")
        out[k] = v
    return out


def cli(args) -> int:
    try:
        suites = load(args.file)
        if not args.name:
            for k in sorted(suites):
                print(f"{k:16s} {suites[k].get('description', '')}")
            return 0
        r = Runner(suites, python=args.python or sys.executable, dry_run=args.dry_run)
        over = _overrides(args.set)
        steps = r.plan(args.name, over, args.out)
        if args.steps:
            pats = [p for p in args.steps.split(",") if p]
            steps = [st for st in steps if any(fnmatch.fnmatch(st.name, p) for p in pats)]
        t0 = time.monotonic()
        out = r.values(args.name, over, args.out)["out"]
        if suites[args.name].get("log"):
            r.log = Path(out) / suites[args.name]["log"]
        r.say(f"suite {args.name}: {len(steps)} steps{' (dry run)' if args.dry_run else ''}, out {out}"
              f"{', log ' + str(r.log) if r.log else ''}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
        rc = r.run(steps)
        done = "dry run" if args.dry_run else f"{r.failed} failed step(s), {len(r.results)} run"
        r.say(f"suite {args.name}: {done} in {time.monotonic() - t0:.0f} s")
        return rc
    except SuiteError as e:
        print(f"hmc bench suite: error: {e}", file=sys.stderr)
        return 2
