"""Set covering (MILP): choose sites at least cost so that every demand zone is covered."""

from __future__ import annotations

import numpy as np

from trex.ordata.generators.base import Domain, Family, cons, make_instance, param, pick, r, slug
from trex.ordata.ir import Instance, Objective, Variable

DOMAINS = (
    Domain("fire", "Fire station siting",
           "A county chooses where to build fire stations so that every neighbourhood is within the response time "
           "of at least one station.", {"money": "thousand dollars", "site": "station site", "zone": "neighbourhood"},
           {"site": ("Site Maple", "Site Cherry", "Site Willow", "Site Aspen", "Site Laurel", "Site Spruce",
                     "Site Hazel"),
            "zone": ("Downtown", "Riverside", "Hillcrest", "Old Town", "Lakeside", "Westgate", "Northfield",
                     "Southport", "Eastwood")}),
    Domain("telecom", "Cell tower placement",
           "An operator picks tower locations so that every village has signal from at least one tower.",
           {"money": "thousand euros", "site": "tower location", "zone": "village"},
           {"site": ("Ridge", "Quarry", "Church hill", "Water tower", "Farm road", "Mill", "Silo"),
            "zone": ("Ashby", "Brook", "Carlton", "Denby", "Elston", "Fenwick", "Grange", "Holt", "Ives")}),
    Domain("crew", "Crew pairing",
           "An airline chooses crew pairings to buy so that every flight leg is covered by at least one pairing.",
           {"money": "hundred dollars", "site": "pairing", "zone": "flight leg"},
           {"site": ("Pairing P1", "Pairing P2", "Pairing P3", "Pairing P4", "Pairing P5", "Pairing P6",
                     "Pairing P7"),
            "zone": ("Leg 101", "Leg 102", "Leg 103", "Leg 104", "Leg 105", "Leg 106", "Leg 107", "Leg 108",
                     "Leg 109")}),
)


def build(rng: np.random.Generator, size: int, dom: Domain, seed: int) -> Instance:
    """``size`` + 1 candidates, ``size`` + 3 zones; every zone covered by at least one candidate (repaired)."""
    sites = pick(rng, dom.names["site"], size + 1)
    zones = pick(rng, dom.names["zone"], size + 3)
    cover = [[1.0 if rng.random() < 0.35 else 0.0 for _ in sites] for _ in zones]
    for row in cover:  # repair: a zone nobody covers gets a random covering site
        if not any(row):
            row[int(rng.integers(len(sites)))] = 1.0
    cost = [r(rng.uniform(20, 120), 0) for _ in sites]
    x = {s: f"build_{slug(s)}" for s in sites}
    variables = [Variable(x[s], "binary", 0.0, 1.0, "", f"1 if {s} is chosen") for s in sites]
    constraints = [cons(f"cover_{slug(z)}", {x[s]: cover[k][i] for i, s in enumerate(sites)}, ">=", 1.0, "cover")
                   for k, z in enumerate(zones)]
    m = dom.words["money"]
    params = [
        param("cost", cost, ["sites"], m, f"cost ({m})", f"Choosing <e> costs <v> {m}."),
        param("covers", cover, ["zones", "sites"], "0/1", "coverage (1 = covered)",
              "Coverage of <e> by <f>: <v> (1 means covered, 0 not)."),
    ]
    obj = Objective("min", {x[s]: cost[i] for i, s in enumerate(sites)}, description="total cost")
    notes = {"objective": f"Minimise the total cost in {m} while covering every {dom.words['zone']}.",
             "rules": f"Each {dom.words['site']} is either chosen or not."}
    return make_instance("set_covering", dom, seed, {"sites": sites, "zones": zones}, params, variables, constraints,
                         obj, notes)


FAMILY = Family("set_covering", "MILP", DOMAINS, build)
