"""Reproduce known incidents: scenarios, the workload driver, hang detection, verdicts."""
