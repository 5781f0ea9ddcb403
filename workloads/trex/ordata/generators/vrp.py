"""Capacitated vehicle routing (MILP): routes from a depot serving all customers within vehicle capacity.

Subtours are eliminated with MTZ-style load variables (load after serving a customer), which also enforce
the capacity.
"""

from __future__ import annotations

import numpy as np

from trex.ordata.generators.base import Domain, Family, Infeasible, cons, make_instance, param, pick, slug
from trex.ordata.ir import Instance, Objective, Variable

DOMAINS = (
    Domain("grocery", "Grocery delivery",
           "A grocer delivers orders from its depot with a small fleet of vans and wants the shortest total "
           "driving distance.", {"d": "km", "q": "crates", "veh": "vans", "base": "Depot"},
           {"cust": ("Shop Alder", "Shop Birch", "Shop Cedar", "Shop Dogwood", "Shop Elm", "Shop Fig", "Shop Gum")}),
    Domain("waste", "Waste collection",
           "A municipality collects waste from collection points with compactor trucks based at the yard.",
           {"d": "km", "q": "tonnes", "veh": "trucks", "base": "Yard"},
           {"cust": ("Point North", "Point South", "Point East", "Point West", "Point Centre", "Point Harbour",
                     "Point Park")}),
    Domain("medical", "Lab sample pickup",
           "A laboratory picks up samples from clinics with couriers starting and ending at the lab.",
           {"d": "miles", "q": "sample boxes", "veh": "couriers", "base": "Lab"},
           {"cust": ("Clinic Ash", "Clinic Bay", "Clinic Cove", "Clinic Dune", "Clinic Fern", "Clinic Glen",
                     "Clinic Hyde")}),
)


def build(rng: np.random.Generator, size: int, dom: Domain, seed: int) -> Instance:
    """Depot plus ``size`` customers, 2 vehicles whose joint capacity covers total demand."""
    nodes = [dom.words["base"], *pick(rng, dom.names["cust"], size)]
    n = len(nodes)
    pts = rng.uniform(0, 50, size=(n, 2))
    dist = [[float(max(1, round(float(np.hypot(*(pts[i] - pts[j])))))) if i != j else 0.0 for j in range(n)]
            for i in range(n)]
    demand = [0.0] + [float(rng.integers(1, 10)) for _ in range(1, n)]
    vehicles = 2.0
    cap = float(max(max(demand), int(np.ceil(sum(demand) / vehicles * rng.uniform(1.05, 1.5)))))
    if vehicles * cap < sum(demand):
        raise Infeasible("fleet capacity below total demand")
    ids = [slug(v) for v in nodes]
    x = {(i, j): f"drive_{ids[i]}_{ids[j]}" for i in range(n) for j in range(n) if i != j}
    load = {i: f"load_{ids[i]}" for i in range(1, n)}
    variables = [Variable(x[i, j], "binary", 0.0, 1.0, "", f"1 if a vehicle drives {nodes[i]} -> {nodes[j]}")
                 for (i, j) in x]
    variables += [Variable(load[i], "continuous", demand[i], cap, dom.words["q"], f"load after {nodes[i]}")
                  for i in load]
    constraints = [cons(f"visit_{ids[j]}", {x[i, j]: 1.0 for i in range(n) if i != j}, "==", 1.0, "visit")
                   for j in range(1, n)]
    constraints += [cons(f"leave_{ids[i]}", {x[i, j]: 1.0 for j in range(n) if j != i}, "==", 1.0, "visit")
                    for i in range(1, n)]
    constraints.append(cons("fleet", {x[0, j]: 1.0 for j in range(1, n)}, "<=", vehicles, "fleet"))
    bal = {x[0, j]: 1.0 for j in range(1, n)}
    bal.update({x[i, 0]: -1.0 for i in range(1, n)})
    constraints.append(cons("depot_balance", bal, "==", 0.0, "fleet"))
    constraints += [cons(f"load_{ids[i]}_{ids[j]}", {load[i]: 1.0, load[j]: -1.0, x[i, j]: cap}, "<=",
                         cap - demand[j], "capacity") for i in load for j in load if i != j]
    d, q, veh = dom.words["d"], dom.words["q"], dom.words["veh"]
    params = [
        param("vehicles", vehicles, [], veh, f"number of {veh}", f"There are <v> {veh} available."),
        param("capacity", cap, [], q, f"capacity per vehicle ({q})", f"Each of the {veh} carries at most <v> {q}."),
        param("demand", demand[1:], ["customers"], q, f"demand ({q})", f"<e> needs <v> {q}."),
        param("distance", dist, ["locations", "locations"], d, f"distance ({d})",
              f"The distance from <e> to <f> is <v> {d}."),
    ]
    obj = Objective("min", {x[i, j]: dist[i][j] for (i, j) in x}, description="total distance")
    notes = {"objective": f"Minimise the total distance driven in {d}.",
             "rules": f"Every route starts and ends at {nodes[0]}. Each customer is visited exactly once by one of "
                      f"the {veh}; a vehicle's deliveries must fit its capacity."}
    return make_instance("vrp", dom, seed, {"locations": nodes, "customers": nodes[1:]}, params, variables,
                         constraints, obj, notes)


FAMILY = Family("vrp", "MILP", DOMAINS, build, note="MTZ load formulation")
