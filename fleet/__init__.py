"""What the dev tools that run a fleet of rasd daemons share (chaos/, sim/, bench/): the
children's environment and their process groups (``fleet.procs``), the DynamoDB stand-ins
and the delay proxy as children (``fleet.backends``), the table as seeded and scanned
(``fleet.tables``), the daemons (``fleet.daemons``), and the replicator as a child
(``fleet.replicator``). Each tool keeps what only it does."""
