"""The only vocabulary shared across processes: events, topic names, configs."""
