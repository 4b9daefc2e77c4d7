"""The daemon: a Unix-socket server speaking msgpack frames, one module per job.

=================  ==========================================================================
``lifecycle``      ``Daemon``: start, serve, hand over, stop; read it top to bottom
``startup``        ``BringUp``: the store brought up, retried while DynamoDB fails, the cached
                   AWS settings confirmed
``signals``        ``run_daemon``: the process's signals wired (stop, SIGHUP's reload)
``connection``     ``Connection``: frames in, answers out, back-pressure, the peer's grant
``routing``        ``Router`` (made and held by ``Daemon``): one entry per frame, ``handle``:
                   the cached hit, a miss, the other ops, the slow path that waits for DynamoDB
``handover``       SIGUSR2: a successor takes the listening socket over without a gap
``exporter``       the metrics on ``metrics_port``, read from the router
``diagnostics``    what a failed start-up says: the root cause, a probe of the endpoint
=================  ==========================================================================

The request protocol itself (fields, answers) is rasd.wire; what a request does is the
roles' that rasd.daemon.coordinator composes.
"""

from .connection import Connection
from .diagnostics import describe_cause
from .lifecycle import LISTEN_BACKLOG, Daemon
from .routing import HIT_SAMPLE
from .signals import run_daemon

__all__ = ["HIT_SAMPLE", "LISTEN_BACKLOG", "Connection", "Daemon", "describe_cause", "run_daemon"]
