"""The global simulation (docs/global.md, "Global simulation"): three regions as separate moto
backends, a replicator with lag and last-writer-wins, real daemons, the jobs, and a traffic
model with day cycles, a news spike and a region evacuation. ``python -m sim --quick``."""
