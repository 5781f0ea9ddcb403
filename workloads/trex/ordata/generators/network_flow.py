"""Network flow (LP): send a required flow from a source to a sink through capacitated arcs at least cost."""

from __future__ import annotations

import numpy as np

from trex.ordata.generators.base import Domain, Family, cons, make_instance, param, pick, r, slug
from trex.ordata.ir import Instance, Objective, Variable

DOMAINS = (
    Domain("pipeline", "Gas pipeline routing",
           "A gas operator routes gas from a production field to a city gate through compressor stations.",
           {"q": "thousand cubic metres", "money": "dollars", "src": "Field", "dst": "City gate"},
           {"node": ("Station Oak", "Station Pine", "Station Elm", "Station Ash", "Station Birch", "Station Cedar",
                     "Station Fir")}),
    Domain("logistics", "Parcel network",
           "A parcel carrier moves parcels from its central hub to a regional depot via sorting centres.",
           {"q": "parcels (hundreds)", "money": "euros", "src": "Hub", "dst": "Depot"},
           {"node": ("Sorter Ghent", "Sorter Liege", "Sorter Namur", "Sorter Mons", "Sorter Bruges", "Sorter Leuven")}),
    Domain("data", "Data-centre traffic",
           "A cloud provider routes replication traffic from a primary data centre to a backup site over "
           "intermediate routers.",
           {"q": "Gbps", "money": "dollars", "src": "Primary DC", "dst": "Backup DC"},
           {"node": ("Router R1", "Router R2", "Router R3", "Router R4", "Router R5", "Router R6", "Router R7")}),
)


def build(rng: np.random.Generator, size: int, dom: Domain, seed: int) -> Instance:
    """Source, sink and ``size`` intermediate nodes; every node links to both ends, plus random cross arcs."""
    mids = pick(rng, dom.names["node"], size)
    s, t = dom.words["src"], dom.words["dst"]
    q, m = dom.words["q"], dom.words["money"]
    nodes = [s, *mids, t]
    arcs: list[tuple[str, str]] = [(s, v) for v in mids] + [(v, t) for v in mids]
    for a in mids:
        for b in mids:
            if a != b and rng.random() < 0.3:
                arcs.append((a, b))
    cap = [float(rng.integers(10, 50)) for _ in arcs]
    cost = [r(rng.uniform(1, 12), 1) for _ in arcs]
    through = sum(min(cap[i], cap[i + size]) for i in range(size))
    flow = float(max(1, int(through * rng.uniform(0.4, 0.8))))
    labels = [f"{a} -> {b}" for a, b in arcs]
    x = {arc: f"flow_{slug(arc[0])}_{slug(arc[1])}" for arc in arcs}
    variables = [Variable(x[arc], "continuous", 0.0, cap[k], q, f"flow on {labels[k]}") for k, arc in enumerate(arcs)]
    constraints = []
    for v in nodes:
        coeffs = {x[arc]: 1.0 for arc in arcs if arc[0] == v}
        for arc in arcs:
            if arc[1] == v:
                coeffs[x[arc]] = coeffs.get(x[arc], 0.0) - 1.0
        rhs = flow if v == s else (-flow if v == t else 0.0)
        constraints.append(cons(f"balance_{slug(v)}", coeffs, "==", rhs, "balance", f"flow balance at {v}"))
    params = [
        param("flow", flow, [], q, f"required flow ({q})", f"A total of <v> {q} must go from {s} to {t}."),
        param("capacity", cap, ["arcs"], q, f"arc capacity ({q})", f"Link <e> carries at most <v> {q}."),
        param("cost", cost, ["arcs"], f"{m}/{q}", f"cost per unit of flow ({m})", f"Each unit sent on <e> costs <v> {m}."),
    ]
    obj = Objective("min", {x[arc]: cost[k] for k, arc in enumerate(arcs)}, description="total routing cost")
    notes = {"objective": f"Minimise the total routing cost in {m}.",
             "rules": "Links are one-way as listed. Flow is conserved at every intermediate node."}
    return make_instance("network_flow", dom, seed, {"nodes": nodes, "arcs": labels}, params, variables, constraints,
                         obj, notes)


FAMILY = Family("network_flow", "LP", DOMAINS, build)
