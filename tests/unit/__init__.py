"""Tests of one piece at a time, fast and with no deployment: unmarked (tests/conftest.py sets a
test's marker from its folder); `make check` and `make test` run them."""
