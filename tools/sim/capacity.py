"""Fleet capacity for a trace's request mix, measured by a saturation run; what ``--load`` is a share of.

The first ``per_replica`` x replicas requests of the trace (order and sizes
kept, 250 per replica by default, at least three batches' worth) all arrive at time 0 and are spread round
robin, so every engine has a deep queue and runs full batches from start to
end. Capacity is the completion rate between the 10th and the 90th percentile
of completion times, ``0.8 x n / (t90 - t10)`` requests per second: the
steady state, without the first giant prefill step and the drain. Round robin
because it is blind to load and cache: the figure is the fleet's raw capacity
for this mix, the same for every policy compared; a policy that gets more
prefix-cache hits has headroom beyond it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from tools.report import percentile
from tools.sim.fleet import Fleet, FleetConfig
from tools.sim.policies import POLICIES
from tools.sim.workload import SimRequest


def measure(requests: Sequence[SimRequest], config: FleetConfig, *, per_replica: int = 250) -> float:
    """Requests per second the fleet completes when saturated; see the module docstring."""
    sample = [dataclasses.replace(r, arrival=0.0) for r in requests[:per_replica * config.replicas]]
    if len(sample) < 3 * config.engine.max_running * config.replicas:
        raise ValueError(f"{len(sample)} requests cannot keep {config.replicas} replicas of "
                         f"{config.engine.max_running} slots saturated: give more, or --capacity")
    result = Fleet(config, POLICIES["round_robin"], sample).run()
    done = [s.e2e for s in result.served if not math.isnan(s.e2e)]
    early, late = percentile(done, 10), percentile(done, 90)
    if late <= early:
        return len(done) / max(late, 1e-9)
    return 0.8 * len(done) / (late - early)
