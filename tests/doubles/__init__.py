"""Test doubles: stand-ins the tests inject through the daemon's seams (a ``Clock``, the
Store's DynamoDB client). Not shipped: the wheel and the .deb hold rasd's packages only."""
