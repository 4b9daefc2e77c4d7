"""What several test modules share, each module named for what it holds. Test modules import
from here (or take a conftest fixture), never from one another: a test module is run by
pytest, not a library (tests/unit/test_suite_layout.py checks it)."""
