"""Assignment (MILP): assign each task to exactly one agent (each agent at most one task) at least cost."""

from __future__ import annotations

import numpy as np

from trex.ordata.generators.base import Domain, Family, cons, make_instance, param, pick, slug
from trex.ordata.ir import Instance, Objective, Variable

DOMAINS = (
    Domain("consulting", "Consultant staffing",
           "A consultancy assigns consultants to client engagements; each engagement needs exactly one consultant "
           "and each consultant takes at most one engagement.", {"cost": "hours of ramp-up", "agent": "consultant"},
           {"agent": ("Ana", "Bo", "Chen", "Dara", "Eli", "Farah", "Goran", "Hana", "Ivo"),
            "task": ("Bank audit", "Retail strategy", "ERP rollout", "Pricing study", "Supply review", "M&A support",
                     "Cloud plan", "HR redesign")}),
    Domain("machines", "Job-to-machine assignment",
           "A machine shop assigns jobs to machines; each job runs on exactly one machine and each machine runs at "
           "most one job this shift.", {"cost": "minutes of processing", "agent": "machine"},
           {"agent": ("Lathe 1", "Lathe 2", "Mill 1", "Mill 2", "Grinder", "Drill press", "CNC A", "CNC B"),
            "task": ("Shaft", "Bracket", "Housing", "Gear", "Flange", "Spindle", "Bushing", "Plate")}),
    Domain("rideshare", "Driver dispatch",
           "A ride-hailing platform matches drivers to waiting riders; every rider gets exactly one driver and "
           "each driver serves at most one rider.", {"cost": "minutes of pickup time", "agent": "driver"},
           {"agent": ("Driver Kim", "Driver Lee", "Driver Mora", "Driver Ngo", "Driver Ortiz", "Driver Park",
                      "Driver Quinn"),
            "task": ("Rider Station", "Rider Airport", "Rider Mall", "Rider Campus", "Rider Stadium",
                     "Rider Harbour", "Rider Museum")}),
)


def build(rng: np.random.Generator, size: int, dom: Domain, seed: int) -> Instance:
    """``size`` tasks and ``size`` + 1 agents (one agent stays idle)."""
    agents = pick(rng, dom.names["agent"], size + 1)
    tasks = pick(rng, dom.names["task"], size)
    cost = [[float(rng.integers(5, 60)) for _ in tasks] for _ in agents]
    x = {(i, j): f"assign_{slug(a)}_{slug(t)}" for i, a in enumerate(agents) for j, t in enumerate(tasks)}
    variables = [Variable(x[i, j], "binary", 0.0, 1.0, "", f"1 if {a} does {t}")
                 for i, a in enumerate(agents) for j, t in enumerate(tasks)]
    constraints = [cons(f"agent_{slug(a)}", {x[i, j]: 1.0 for j in range(len(tasks))}, "<=", 1.0, "agent")
                   for i, a in enumerate(agents)]
    constraints += [cons(f"task_{slug(t)}", {x[i, j]: 1.0 for i in range(len(agents))}, "==", 1.0, "task")
                    for j, t in enumerate(tasks)]
    c = dom.words["cost"]
    params = [param("cost", cost, ["agents", "tasks"], c, f"cost ({c})", f"Assigning <e> to <f> costs <v> {c}.")]
    obj = Objective("min", {x[i, j]: cost[i][j] for i in range(len(agents)) for j in range(len(tasks))},
                    description="total assignment cost")
    notes = {"objective": f"Minimise the total cost in {c}.",
             "rules": f"Every task gets exactly one {dom.words['agent']}; each {dom.words['agent']} takes at most "
                      f"one task."}
    return make_instance("assignment", dom, seed, {"agents": agents, "tasks": tasks}, params, variables, constraints,
                         obj, notes)


FAMILY = Family("assignment", "MILP", DOMAINS, build)
