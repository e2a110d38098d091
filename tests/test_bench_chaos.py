"""The chaos bench's accounting of lost requests, on hand-made run data."""

from __future__ import annotations

from benchmarks.chaos import lost_requests


def test_lost_requests_tell_the_brokers_losses_from_the_roles() -> None:
    run = {  # requests r0 (partition 0) and r1 (partition 1), n = 2; the broker was killed at t = 50
        "requests": [("r0", 2, 10.0), ("r1", 2, 10.0), ("r2", 2, 60.0), ("late", 2, 290.0)],
        "request_partition": {"r0": 0, "r1": 1, "r2": 0, "late": 1},
        # r0's trajectories went to partition 0, which kept nothing from before t = 50; r1 lost one
        # trajectory though partition 1 kept its earlier records (a role's loss); r2 came after the kill
        "trajectories": [("r1/0", 1, 20.0), ("r2/0", 0, 70.0), ("r2/1", 0, 71.0), ("late/0", 1, 300.0)],
    }
    counted = lost_requests(run, settle_s=100.0, broker_killed_at=50.0)
    assert counted["settled_requests"] == 3 and counted["lost_ids"] == ["r0", "r1"]  # "late": too recent
    assert counted["lost_with_the_broker"] == 1 and counted[
        "trajectory_partitions_emptied_by_the_broker"
    ] == [0]
    no_kill = lost_requests(run, settle_s=100.0)
    assert no_kill["lost"] == 2 and no_kill["lost_with_the_broker"] == 0
