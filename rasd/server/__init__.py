"""The daemon's process: a Unix-socket server speaking msgpack frames, one module per job.

``lifecycle`` (``Daemon``: start, serve, hand over, stop), ``startup`` (``BringUp``),
``signals`` (``run_daemon``), ``connection`` (``Connection``), ``routing`` (``Router``: one
entry per frame), ``handover`` (SIGUSR2), ``exporter`` (metrics), ``diagnostics`` (a failed
start-up's cause). docs/architecture.md, "The roles of one daemon".
"""

from .connection import Connection
from .diagnostics import describe_cause
from .lifecycle import LISTEN_BACKLOG, Daemon
from .routing import HIT_SAMPLE
from .signals import run_daemon

__all__ = ["HIT_SAMPLE", "LISTEN_BACKLOG", "Connection", "Daemon", "describe_cause", "run_daemon"]
