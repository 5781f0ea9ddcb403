"""Transportation (LP): ship from supply points to demand points at least cost."""

from __future__ import annotations

import numpy as np

from trex.ordata.generators.base import Domain, Family, Infeasible, cons, make_instance, param, pick, r, slug
from trex.ordata.ir import Instance, Objective, Variable

DOMAINS = (
    Domain("grain", "Grain distribution",
           "A grain cooperative ships wheat from its silos to flour mills and wants the cheapest shipping plan.",
           {"q": "tons", "money": "dollars"},
           {"src": ("Silo North", "Silo East", "Silo River", "Silo Hill", "Silo Lake", "Silo West"),
            "dst": ("Mill Alpha", "Mill Beta", "Mill Gamma", "Mill Delta", "Mill Epsilon", "Mill Zeta", "Mill Eta")}),
    Domain("retail", "Retail replenishment",
           "A retailer moves pallets from its warehouses to stores and wants to minimise freight cost.",
           {"q": "pallets", "money": "euros"},
           {"src": ("Warehouse Lyon", "Warehouse Lille", "Warehouse Nantes", "Warehouse Metz", "Warehouse Pau"),
            "dst": ("Store Paris", "Store Rennes", "Store Dijon", "Store Nice", "Store Tours", "Store Caen",
                    "Store Brest")}),
    Domain("energy", "Fuel supply",
           "A utility sends fuel oil from refineries to power stations and wants the cheapest delivery plan.",
           {"q": "kilolitres", "money": "dollars"},
           {"src": ("Refinery A", "Refinery B", "Refinery C", "Refinery D", "Refinery E"),
            "dst": ("Station 1", "Station 2", "Station 3", "Station 4", "Station 5", "Station 6", "Station 7")}),
)


def build(rng: np.random.Generator, size: int, dom: Domain, seed: int) -> Instance:
    """``size`` sources and ``size``+1 destinations; total supply exceeds total demand."""
    srcs = pick(rng, dom.names["src"], size)
    dsts = pick(rng, dom.names["dst"], size + 1)
    q, m = dom.words["q"], dom.words["money"]
    demand = [float(rng.integers(20, 90)) for _ in dsts]
    supply = [float(rng.integers(30, 120)) for _ in srcs]
    if sum(supply) < sum(demand):
        raise Infeasible("total supply is below total demand")
    cost = [[r(rng.uniform(1, 20), 1) for _ in dsts] for _ in srcs]
    x = {(i, j): f"ship_{slug(s)}_{slug(d)}" for i, s in enumerate(srcs) for j, d in enumerate(dsts)}
    variables = [Variable(x[i, j], "continuous", 0.0, None, q, f"{q} from {s} to {d}")
                 for i, s in enumerate(srcs) for j, d in enumerate(dsts)]
    constraints = [cons(f"supply_{slug(s)}", {x[i, j]: 1.0 for j in range(len(dsts))}, "<=", supply[i], "supply")
                   for i, s in enumerate(srcs)]
    constraints += [cons(f"demand_{slug(d)}", {x[i, j]: 1.0 for i in range(len(srcs))}, ">=", demand[j], "demand")
                    for j, d in enumerate(dsts)]
    params = [
        param("supply", supply, ["sources"], q, f"supply ({q})", f"<e> can ship at most <v> {q}."),
        param("demand", demand, ["destinations"], q, f"demand ({q})", f"<e> requires at least <v> {q}."),
        param("cost", cost, ["sources", "destinations"], f"{m}/{q}", f"shipping cost per unit ({m})",
              f"Shipping one unit from <e> to <f> costs <v> {m}."),
    ]
    obj = Objective("min", {x[i, j]: cost[i][j] for i in range(len(srcs)) for j in range(len(dsts))},
                    description="total shipping cost")
    notes = {"objective": f"Minimise the total shipping cost in {m} while meeting every demand.",
             "rules": "Any source may ship to any destination; quantities may be fractional."}
    return make_instance("transportation", dom, seed, {"sources": srcs, "destinations": dsts}, params, variables,
                         constraints, obj, notes)


FAMILY = Family("transportation", "LP", DOMAINS, build)
