"""The daemon: its roles, its runtime and its state."""
