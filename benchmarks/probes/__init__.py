"""Probes: each answers one question (a cost, a floor, a timeline, a soak)."""
