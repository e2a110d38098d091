"""Event-level logic that several roles share: the task pool, judged groups to training samples, and
held-out evaluation. Pure of processes and topics: roles and commands call it."""
