"""The chaos bench's accounting of lost requests, on hand-made run data."""

from __future__ import annotations

from benchmarks.chaos import lost_requests, trajectory_partition


def test_lost_requests_tell_the_brokers_losses_from_the_roles() -> None:
    # a trajectory's partition is murmur2 of its key over 8 partitions, as the producer places it:
    # r0/0 -> 1, r0/1 -> 5, r1/0 and r1/1 -> 3, r2/0 and r2/1 -> 1
    assert [trajectory_partition(k, 8) for k in ("r0/0", "r0/1", "r1/0", "r1/1", "r2/0")] == [1, 5, 3, 3, 1]
    run = {  # requests of n = 2; the broker was killed at t = 50
        "requests": [("r0", 2, 10.0), ("r1", 2, 10.0), ("r2", 2, 60.0), ("late", 2, 290.0)],
        # r0's trajectories belong on partitions 1 and 5, which kept nothing from before t = 50; r1 lost
        # r1/1 though its partition 3 kept r1/0 (a role's loss); r2 came after the kill
        "trajectories": [("r1/0", 3, 20.0), ("r2/0", 1, 70.0), ("r2/1", 1, 71.0), ("late/0", 7, 300.0)],
    }
    counted = lost_requests(run, settle_s=100.0, broker_killed_at=50.0)
    assert counted["settled_requests"] == 3 and counted["lost_ids"] == ["r0", "r1"]  # "late": too recent
    assert counted["lost_with_the_broker"] == 1
    assert counted["trajectory_partitions_emptied_by_the_broker"] == [1, 5]
    no_kill = lost_requests(run, settle_s=100.0)
    assert no_kill["lost"] == 2 and no_kill["lost_with_the_broker"] == 0
