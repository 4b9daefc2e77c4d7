"""What the dev tools that run a fleet of rasd daemons share (chaos/, sim/, bench/): the
children's environment and their process groups (``fleet.procs``), the DynamoDB stand-ins
and the proxy as children (``fleet.backends``), the proxy itself: delay, faults and hooks
(``fleet.proxy``, ``fleet.httpwire``), the table as seeded and scanned
(``fleet.tables``), the daemons (``fleet.daemons``), and the replicator as a child
(``fleet.replicator``). Each tool keeps what only it does."""
