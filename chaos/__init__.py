"""The chaos run: rasd daemons in two regions behind fault-injecting proxies, apps recording
histories, the jobs on loops, kill -9 of daemons, and an audit of what the apps saw
(docs/reliability.md). ``python -m chaos --help``."""
