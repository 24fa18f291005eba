"""Backend and alias admin API, their persistence and cross-replica sync."""
