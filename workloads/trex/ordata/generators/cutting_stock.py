"""Cutting stock (integer pattern model): choose how many stock rolls to cut with each given pattern.

The patterns are part of the data (homogeneous patterns plus random maximal mixed patterns); the model is the
integer pattern model, minimising the number of rolls cut.
"""

from __future__ import annotations

import numpy as np

from trex.ordata.generators.base import Domain, Family, cons, make_instance, param, pick, slug
from trex.ordata.ir import Instance, Objective, Variable

DOMAINS = (
    Domain("paper", "Paper mill trimming",
           "A paper mill cuts jumbo rolls into narrower rolls ordered by customers and wants to use as few jumbo "
           "rolls as possible.", {"len": "cm", "stock": "jumbo rolls", "piece": "rolls"},
           {"piece": ("Narrow", "Standard", "Wide", "Extra wide", "Label", "Tissue", "Kraft")}),
    Domain("steel", "Steel bar cutting",
           "A steel service centre cuts stock bars into ordered lengths and wants to cut as few stock bars as "
           "possible.", {"len": "mm", "stock": "stock bars", "piece": "bars"},
           {"piece": ("Rebar A", "Rebar B", "Rebar C", "Rebar D", "Rebar E", "Rebar F")}),
    Domain("textile", "Fabric cutting",
           "A textile plant cuts fabric bolts into ordered widths and wants to use the fewest bolts.",
           {"len": "inches", "stock": "bolts", "piece": "strips"},
           {"piece": ("Denim strip", "Canvas strip", "Linen strip", "Twill strip", "Satin strip", "Poplin strip")}),
)


def build(rng: np.random.Generator, size: int, dom: Domain, seed: int) -> Instance:
    """``size`` piece types; patterns: one homogeneous per piece plus ``size`` random maximal mixes."""
    pieces = pick(rng, dom.names["piece"], size)
    width = float(rng.integers(80, 200))
    w = [float(rng.integers(int(width * 0.12), int(width * 0.45))) for _ in pieces]
    demand = [float(rng.integers(5, 40)) for _ in pieces]
    patterns: list[list[float]] = []
    for i in range(size):
        col = [0.0] * size
        col[i] = float(width // w[i])
        patterns.append(col)
    for _ in range(size):
        col, left = [0.0] * size, width
        for i in rng.permutation(size):
            k = int(left // w[int(i)]) if rng.random() < 0.7 else 0
            k = int(rng.integers(0, k + 1)) if k else 0
            col[int(i)] += k
            left -= k * w[int(i)]
        for i in (int(j) for j in rng.permutation(size)):  # fill what is left in a random order
            while left >= w[i]:
                col[i] += 1
                left -= w[i]
        if col not in patterns:
            patterns.append(col)
    pnames = [f"Pattern {k + 1}" for k in range(len(patterns))]
    x = [f"cut_{slug(p)}" for p in pnames]
    variables = [Variable(x[k], "integer", 0.0, None, dom.words["stock"], f"{dom.words['stock']} cut with {p}")
                 for k, p in enumerate(pnames)]
    constraints = [cons(f"demand_{slug(pc)}", {x[k]: patterns[k][i] for k in range(len(patterns))}, ">=", demand[i],
                        "demand", f"{pc} ordered") for i, pc in enumerate(pieces)]
    ln, piece = dom.words["len"], dom.words["piece"]
    table = [[patterns[k][i] for k in range(len(patterns))] for i in range(size)]
    params = [
        param("stock_width", width, [], ln, f"stock width ({ln})", f"Each of the {dom.words['stock']} is <v> {ln} wide."),
        param("piece_width", w, ["pieces"], ln, f"piece width ({ln})", f"<e> {piece} are <v> {ln} wide."),
        param("demand", demand, ["pieces"], piece, f"{piece} ordered", f"Customers ordered <v> {piece} of <e>."),
        param("pattern", table, ["pieces", "patterns"], piece, f"{piece} per pattern", "<f> yields <v> of <e>."),
    ]
    obj = Objective("min", {v: 1.0 for v in x}, description=f"{dom.words['stock']} used")
    notes = {"objective": f"Minimise the number of {dom.words['stock']} cut.",
             "rules": "Only the listed cutting patterns may be used, each a whole number of times; overproduction is "
                      "allowed. The pattern model is integer (not its LP relaxation)."}
    return make_instance("cutting_stock", dom, seed, {"pieces": pieces, "patterns": pnames}, params, variables,
                         constraints, obj, notes)


FAMILY = Family("cutting_stock", "MILP", DOMAINS, build, note="integer pattern model over given patterns")
