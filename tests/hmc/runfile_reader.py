"""A run-file reader that knows only docs/runfile.md, h5py and NumPy (run as a script by test_runfile_schema.py,
with the project's packages made unimportable): it loads the configuration as the attributes of /gauge/links
describe it, recomputes the plaquette and prints what it found as JSON."""
import json
import sys

for name in ("hmc", "lattice", "comms", "solvers", "force"):
    sys.modules[name] = None           # importing the project here fails

import h5py
import numpy as np


def plaquettes(u_mu, dims_axis):
    """MILC's (ss, st): <ReTr P_{mu nu}> over the sites and the space-space / space-time planes.
    ``u_mu[mu]`` is U_mu on an array whose axis ``dims_axis[nu]`` runs along direction nu."""
    def shift(a, mu):
        return np.roll(a, -1, axis=dims_axis[mu])

    def retr(mu, nu):
        a, b = u_mu[mu], u_mu[nu]
        return np.einsum("...ab,...bc,...dc,...ad->...", a, shift(b, mu), shift(a, nu).conj(), b.conj()).real.mean()

    ss = sum(retr(mu, nu) for mu in range(3) for nu in range(mu + 1, 3)) / 3
    st = sum(retr(mu, 3) for mu in range(3)) / 3
    return ss, st


def text(value):
    """A string attribute: fixed-length strings (this hmc's files) read back as bytes, variable-length ones (older
    files) as str (docs/runfile.md)."""
    return value.decode() if isinstance(value, bytes) else value


def read(path):
    with h5py.File(path, "r") as f:
        assert text(f.attrs["format"]) == "hisq-hmc run file"
        version = int(f.attrs.get("format_version", 1))
        assert version <= 2, version
        ds = f["gauge/links"]
        axes = text(ds.attrs["axis_order"]).split(",")
        directions = text(ds.attrs["direction_order"]).split(",")
        dims = dict(zip(text(ds.attrs["dims_order"]).split(","), (int(n) for n in ds.attrs["dims"])))
        assert text(ds.attrs["boundary_conditions"]).split(",") == ["periodic"] * 4
        links = ds[()]
        for ax, n in zip(axes, links.shape):
            if ax in dims:
                assert dims[ax] == n, (ax, dims[ax], n)
        # U_mu for mu in x, y, z, t order, site axes kept where the file has them
        mu_axis = axes.index("mu")
        u = np.moveaxis(links, [mu_axis, axes.index("row"), axes.index("col")], [0, -2, -1])
        site_axes = [a for a in axes if a not in ("mu", "row", "col")]
        u_mu = [u[directions.index(d)] for d in "xyzt"]
        ss, st = plaquettes(u_mu, {mu: site_axes.index(d) for mu, d in enumerate("xyzt")})
        g = f["gauge"].attrs
        h = f["history"]
        columns = [c for c in text(h.attrs["columns"]).split(",") if c]
        undescribed = []
        f.visititems(lambda name, obj: undescribed.append(name) if "description" not in obj.attrs or (
            isinstance(obj, h5py.Dataset) and "units" not in obj.attrs) else None)
        return {
            "version": version, "ss": ss, "st": st, "plaquette": (ss + st) / 6,
            "recorded": [float(g["plaquette_ss"]), float(g["plaquette_st"]), float(g["plaquette"])],
            "trajectory": int(f.attrs["trajectory"]), "gauge_trajectory": int(g["trajectory"]),
            "history_last": {c: h[c][-1].item() for c in columns} if int(f.attrs["trajectory"]) else {},
            "history_lengths": [len(h[c]) for c in columns],
            "dtypes": {c: str(h[c].dtype) for c in columns},
            "undescribed": undescribed,
        }


if __name__ == "__main__":
    print(json.dumps(read(sys.argv[1])))
