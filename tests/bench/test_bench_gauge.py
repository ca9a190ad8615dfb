"""hmc bench gauge: the force-evaluation count it prints is the schedule's that ran, not a fixed number (issue 20)."""
import types


def test_force_evaluations_counted_from_the_schedule(monkeypatch, capsys):
    from bench import gauge
    from hmc.integrators import Level, build_schedule, force_evaluations

    ran = []

    def six_steps(levels, tau):                # another schedule than the usual 10 steps: the count must follow
        sched = build_schedule([Level(lv.scheme, 6, lv.monomials) for lv in levels], tau)
        ran.append(sched)
        return sched

    monkeypatch.setattr(gauge, "build_schedule", six_steps)
    monkeypatch.setattr(gauge, "copy_bandwidth", lambda backend: 1e10)     # no 1 GiB copy in a unit test
    monkeypatch.setattr(gauge, "_timed", lambda backend, fn, repeat: 1.0)  # the count, not the timing
    args = types.SimpleNamespace(backend="numpy", lattice=[2, 2, 2, 2], action="wilson", repeat=1, json=False)
    out = gauge.bench_gauge(args)
    n = force_evaluations(ran[0])["gauge"]
    assert n == 6
    assert out["force_evaluations_per_trajectory"] == n
    assert ", 6 force evaluations)" in capsys.readouterr().out
