"""Tests that start no deployment but ask real OPA, Envoy or kubernetes-validate about whole
topologies: marked `integration` from this folder (tests/conftest.py); `make check` and
`make test` run them."""
