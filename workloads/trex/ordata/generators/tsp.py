"""Travelling salesman (MILP, MTZ subtour elimination): shortest round trip through every location."""

from __future__ import annotations

import numpy as np

from trex.ordata.generators.base import Domain, Family, cons, make_instance, param, pick, slug
from trex.ordata.ir import Instance, Objective, Variable

DOMAINS = (
    Domain("sales", "Sales rep tour",
           "A sales representative leaves the office, visits every client once and returns, and wants the "
           "shortest tour.", {"d": "km", "base": "Office"},
           {"stop": ("Client Avon", "Client Baker", "Client Crane", "Client Dale", "Client Eden", "Client Frost",
                     "Client Gale")}),
    Domain("pcb", "PCB drilling",
           "A drilling head starts from its home position, drills every hole once and returns; travel distance "
           "should be as short as possible.", {"d": "mm", "base": "Home"},
           {"stop": ("Hole H1", "Hole H2", "Hole H3", "Hole H4", "Hole H5", "Hole H6", "Hole H7")}),
    Domain("tourism", "City sightseeing",
           "A tour guide starts at the hotel, shows the group every landmark once and returns to the hotel by the "
           "shortest walking route.", {"d": "hundred metres", "base": "Hotel"},
           {"stop": ("Cathedral", "Museum", "Old bridge", "Market", "Castle", "Opera", "Harbour")}),
)


def build(rng: np.random.Generator, size: int, dom: Domain, seed: int) -> Instance:
    """Base plus ``size`` stops with rounded Euclidean distances (symmetric)."""
    nodes = [dom.words["base"], *pick(rng, dom.names["stop"], size)]
    n = len(nodes)
    pts = rng.uniform(0, 100, size=(n, 2))
    dist = [[float(max(1, round(float(np.hypot(*(pts[i] - pts[j])))))) if i != j else 0.0 for j in range(n)]
            for i in range(n)]
    ids = [slug(v) for v in nodes]
    x = {(i, j): f"go_{ids[i]}_{ids[j]}" for i in range(n) for j in range(n) if i != j}
    u = {i: f"order_{ids[i]}" for i in range(1, n)}
    variables = [Variable(x[i, j], "binary", 0.0, 1.0, "", f"1 if the tour goes from {nodes[i]} to {nodes[j]}")
                 for (i, j) in x]
    variables += [Variable(u[i], "continuous", 1.0, float(n - 1), "", f"position of {nodes[i]} in the tour")
                  for i in u]
    constraints = [cons(f"leave_{ids[i]}", {x[i, j]: 1.0 for j in range(n) if j != i}, "==", 1.0, "degree")
                   for i in range(n)]
    constraints += [cons(f"enter_{ids[j]}", {x[i, j]: 1.0 for i in range(n) if i != j}, "==", 1.0, "degree")
                    for j in range(n)]
    constraints += [cons(f"mtz_{ids[i]}_{ids[j]}", {u[i]: 1.0, u[j]: -1.0, x[i, j]: float(n - 1)}, "<=",
                         float(n - 2), "subtour") for i in u for j in u if i != j]
    d = dom.words["d"]
    params = [param("distance", dist, ["locations", "locations"], d, f"distance ({d})",
                    f"The distance from <e> to <f> is <v> {d}.")]
    obj = Objective("min", {x[i, j]: dist[i][j] for (i, j) in x}, description="tour length")
    notes = {"objective": f"Minimise the total tour length in {d}.",
             "rules": f"The tour starts and ends at {nodes[0]} and visits every other location exactly once."}
    return make_instance("tsp", dom, seed, {"locations": nodes}, params, variables, constraints, obj, notes)


FAMILY = Family("tsp", "MILP", DOMAINS, build, note="MTZ subtour elimination")
