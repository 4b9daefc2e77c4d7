"""A deterministic protocol model checker for rasd's acquisition protocol (docs/checker.md).

``python -m check`` explores the real rules (``rasd.core.decide``, the writes of
``rasd.core.builders`` and ``.map_builders`` applied with ``rasd.core.writes.apply``) and the
known-bad rule sets (``check.rulesets``) against a model of DynamoDB with lost requests and
replies, delayed writes, crashes and clock skew.
"""
