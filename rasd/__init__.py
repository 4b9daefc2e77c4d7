"""rasd: a per-host sidecar daemon that hands out exclusive, expiring leases from DynamoDB."""

__version__ = "0.1.0"
