"""Bin packing (MILP): pack items into the fewest identical bins."""

from __future__ import annotations

import numpy as np

from trex.ordata.generators.base import Domain, Family, cons, make_instance, param, pick, slug
from trex.ordata.ir import Instance, Objective, Variable

DOMAINS = (
    Domain("shipping", "Container loading",
           "A freight forwarder packs shipments into identical containers and wants to use as few containers as "
           "possible.", {"w": "cubic metres", "bin": "containers"},
           {"item": ("Crate A", "Crate B", "Crate C", "Crate D", "Crate E", "Crate F", "Crate G", "Crate H")}),
    Domain("cloud", "VM consolidation",
           "A cloud team places virtual machines onto identical servers by memory and wants to power on as few "
           "servers as possible.", {"w": "GB", "bin": "servers"},
           {"item": ("vm-web", "vm-db", "vm-cache", "vm-batch", "vm-api", "vm-search", "vm-queue", "vm-ml")}),
    Domain("broadcast", "Ad-break filling",
           "A TV channel fits commercials into identical ad breaks and wants to use the fewest breaks.",
           {"w": "seconds", "bin": "ad breaks"},
           {"item": ("Car ad", "Soda ad", "Bank ad", "Phone ad", "Travel ad", "Snack ad", "Game ad", "Shoe ad")}),
)


def build(rng: np.random.Generator, size: int, dom: Domain, seed: int) -> Instance:
    """``size`` + 1 items, as many candidate bins; every item fits a bin on its own."""
    items = pick(rng, dom.names["item"], size + 1)
    cap = float(rng.integers(50, 120))
    wt = [float(rng.integers(int(cap * 0.15), int(cap * 0.7))) for _ in items]
    bins = [f"Bin {k + 1}" for k in range(len(items))]
    y = [f"use_bin_{k + 1}" for k in range(len(bins))]
    x = {(i, k): f"put_{slug(it)}_bin_{k + 1}" for i, it in enumerate(items) for k in range(len(bins))}
    variables = [Variable(v, "binary", 0.0, 1.0, "", f"1 if {bins[k]} is used") for k, v in enumerate(y)]
    variables += [Variable(x[i, k], "binary", 0.0, 1.0, "", f"1 if {it} goes into {bins[k]}")
                  for i, it in enumerate(items) for k in range(len(bins))]
    constraints = [cons(f"place_{slug(it)}", {x[i, k]: 1.0 for k in range(len(bins))}, "==", 1.0, "placement")
                   for i, it in enumerate(items)]
    for k in range(len(bins)):
        coeffs = {x[i, k]: wt[i] for i in range(len(items))}
        coeffs[y[k]] = -cap
        constraints.append(cons(f"capacity_bin_{k + 1}", coeffs, "<=", 0.0, "capacity"))
    for k in range(len(bins) - 1):  # symmetry breaking: use bins in order
        constraints.append(cons(f"order_bin_{k + 1}", {y[k]: 1.0, y[k + 1]: -1.0}, ">=", 0.0, "symmetry"))
    w, b = dom.words["w"], dom.words["bin"]
    params = [
        param("size", wt, ["items"], w, f"size ({w})", f"<e> takes <v> {w}."),
        param("capacity", cap, [], w, f"capacity of each of the {b} ({w})", f"Each of the {b} holds at most <v> {w}."),
    ]
    obj = Objective("min", {v: 1.0 for v in y}, description=f"{b} used")
    notes = {"objective": f"Minimise the number of {b} used.",
             "rules": f"Every item goes into exactly one of the {b} and cannot be split."}
    return make_instance("bin_packing", dom, seed, {"items": items, "bins": bins}, params, variables, constraints, obj,
                         notes)


FAMILY = Family("bin_packing", "MILP", DOMAINS, build)
