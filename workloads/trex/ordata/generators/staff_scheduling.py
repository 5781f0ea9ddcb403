"""Staff scheduling (LP): cover per-period staffing needs with overlapping shifts at least cost.

Shifts cover two consecutive periods (cyclically); staff levels are full-time equivalents, so the model is
an LP (fractional FTEs allowed).
"""

from __future__ import annotations

import numpy as np

from trex.ordata.generators.base import Domain, Family, cons, make_instance, param, pick, r, slug
from trex.ordata.ir import Instance, Objective, Variable

DOMAINS = (
    Domain("call_center", "Call-centre staffing",
           "A call centre staffs its day in blocks; each agent shift spans two consecutive blocks, and the day "
           "wraps around so the last block's shift continues into the first block.",
           {"staff": "agents", "money": "dollars"},
           {"period": ("00-04", "04-08", "08-12", "12-16", "16-20", "20-24", "Night", "Dawn")}),
    Domain("hospital", "Nurse rostering",
           "A hospital ward schedules nurses over the periods of a day; each nurse shift spans two consecutive "
           "periods and the schedule repeats daily.",
           {"staff": "nurses", "money": "dollars"},
           {"period": ("Early", "Morning", "Midday", "Afternoon", "Evening", "Late", "Night", "Small hours")}),
    Domain("airport", "Airport security lanes",
           "An airport plans security officers across the day's periods; every shift covers two consecutive periods "
           "and the day is cyclic.",
           {"staff": "officers", "money": "euros"},
           {"period": ("P1", "P2", "P3", "P4", "P5", "P6", "P7", "P8")}),
)


def build(rng: np.random.Generator, size: int, dom: Domain, seed: int) -> Instance:
    """``size`` periods (at least 3); shift k starts in period k and covers k and k+1 (mod size)."""
    n = max(size, 3)
    periods = list(dom.names["period"])[:n] if len(dom.names["period"]) >= n else pick(rng, dom.names["period"], n)
    s, m = dom.words["staff"], dom.words["money"]
    need = [float(rng.integers(3, 25)) for _ in periods]
    cost = [r(rng.uniform(80, 160), 0) for _ in periods]
    x = {p: f"start_{slug(p)}" for p in periods}
    variables = [Variable(x[p], "continuous", 0.0, None, "FTE", f"{s} starting in {p}") for p in periods]
    constraints = [cons(f"cover_{slug(p)}", {x[p]: 1.0, x[periods[k - 1]]: 1.0}, ">=", need[k], "coverage",
                        f"{s} on duty in {p}") for k, p in enumerate(periods)]
    params = [
        param("need", need, ["periods"], s, f"{s} required", f"Period <e> needs at least <v> {s} on duty."),
        param("shift_cost", cost, ["periods"], m, f"cost per shift starting in the period ({m})",
              f"A shift starting in <e> costs <v> {m}."),
    ]
    obj = Objective("min", {x[p]: cost[k] for k, p in enumerate(periods)}, description="total staffing cost")
    order = ", ".join(periods)
    notes = {"objective": f"Minimise the total staffing cost in {m}.",
             "rules": f"The periods in order are {order}. A shift starting in a period also covers the next one "
                      f"(the last wraps to the first). Staff levels are full-time equivalents and may be fractional."}
    return make_instance("staff_scheduling", dom, seed, {"periods": periods}, params, variables, constraints, obj,
                         notes)


FAMILY = Family("staff_scheduling", "LP", DOMAINS, build, note="LP over full-time equivalents")
