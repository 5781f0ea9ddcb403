"""Capacitated facility location (MILP): open facilities and serve customer demand at least total cost."""

from __future__ import annotations

import numpy as np

from trex.ordata.generators.base import Domain, Family, Infeasible, cons, make_instance, param, pick, r, slug
from trex.ordata.ir import Instance, Objective, Variable

DOMAINS = (
    Domain("warehouses", "Warehouse network design",
           "A distributor decides which candidate warehouses to open and how to supply its customers from them.",
           {"q": "pallets", "money": "dollars", "fac": "warehouse"},
           {"fac": ("Site Reno", "Site Boise", "Site Fresno", "Site Tucson", "Site Provo"),
            "cust": ("Customer SF", "Customer LA", "Customer SD", "Customer LV", "Customer PHX", "Customer SLC",
                     "Customer SAC", "Customer PDX")}),
    Domain("clinics", "Vaccination hubs",
           "A health authority chooses which vaccination hubs to open and assigns district demand to them.",
           {"q": "doses (hundreds)", "money": "euros", "fac": "hub"},
           {"fac": ("Hub Arena", "Hub School", "Hub Library", "Hub Mall", "Hub Stadium"),
            "cust": ("District 1", "District 2", "District 3", "District 4", "District 5", "District 6",
                     "District 7", "District 8")}),
    Domain("datacenters", "Edge server placement",
           "A streaming service chooses which edge sites to lease and which regions each site serves.",
           {"q": "Gbps", "money": "dollars", "fac": "edge site"},
           {"fac": ("Edge Frankfurt", "Edge Madrid", "Edge Warsaw", "Edge Milan", "Edge Oslo"),
            "cust": ("Region DE", "Region FR", "Region ES", "Region IT", "Region PL", "Region NO", "Region NL",
                     "Region AT")}),
)


def build(rng: np.random.Generator, size: int, dom: Domain, seed: int) -> Instance:
    """3 candidate facilities, ``size`` customers; total capacity exceeds total demand."""
    facs = pick(rng, dom.names["fac"], 3)
    custs = pick(rng, dom.names["cust"], size)
    q, m = dom.words["q"], dom.words["money"]
    demand = [float(rng.integers(10, 50)) for _ in custs]
    cap = [float(int(sum(demand) * rng.uniform(0.45, 0.8))) for _ in facs]
    if sum(cap) < sum(demand) or max(cap) < max(demand):
        raise Infeasible("facility capacity cannot cover demand")
    fixed = [r(rng.uniform(100, 400), 0) for _ in facs]
    cost = [[r(rng.uniform(1, 10), 1) for _ in custs] for _ in facs]
    y = {f: f"open_{slug(f)}" for f in facs}
    x = {(i, j): f"serve_{slug(f)}_{slug(c)}" for i, f in enumerate(facs) for j, c in enumerate(custs)}
    variables = [Variable(y[f], "binary", 0.0, 1.0, "", f"1 if {f} is opened") for f in facs]
    variables += [Variable(x[i, j], "continuous", 0.0, None, q, f"{q} sent from {f} to {c}")
                  for i, f in enumerate(facs) for j, c in enumerate(custs)]
    constraints = [cons(f"demand_{slug(c)}", {x[i, j]: 1.0 for i in range(len(facs))}, "==", demand[j], "demand")
                   for j, c in enumerate(custs)]
    for i, f in enumerate(facs):
        coeffs = {x[i, j]: 1.0 for j in range(len(custs))}
        coeffs[y[f]] = -cap[i]
        constraints.append(cons(f"capacity_{slug(f)}", coeffs, "<=", 0.0, "capacity", f"{f} ships only if open"))
    fw = dom.words["fac"]
    params = [
        param("fixed_cost", fixed, ["facilities"], m, f"fixed opening cost ({m})", f"Opening <e> costs <v> {m}."),
        param("capacity", cap, ["facilities"], q, f"capacity ({q})", f"An open <e> can ship at most <v> {q}."),
        param("demand", demand, ["customers"], q, f"demand ({q})", f"<e> needs <v> {q}."),
        param("unit_cost", cost, ["facilities", "customers"], f"{m}/{q}", f"unit supply cost ({m})",
              f"Supplying one unit from <e> to <f> costs <v> {m}."),
    ]
    lin = {y[f]: fixed[i] for i, f in enumerate(facs)}
    lin.update({x[i, j]: cost[i][j] for i in range(len(facs)) for j in range(len(custs))})
    obj = Objective("min", lin, description="fixed plus supply cost")
    notes = {"objective": f"Minimise the total of opening and supply costs in {m}.",
             "rules": f"A closed {fw} ships nothing. Each customer's demand may be split across several sites."}
    return make_instance("facility_location", dom, seed, {"facilities": facs, "customers": custs}, params, variables,
                         constraints, obj, notes)


FAMILY = Family("facility_location", "MILP", DOMAINS, build)
