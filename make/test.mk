##@ Testing
# The tiers are folders, each test marked from its own (tests/conftest.py): the two that start no
# deployment, which make check runs, and the end-to-end one. The integration tests first: make
# check's workers take files in this order, the costly ones (a minute of CPU and more) first and
# the many small unit files last, to even out their ends.
NO_DEPLOYMENT := tests/integration tests/unit
E2E := tests/e2e
E2E_EXPERIMENTS := tests/e2e/experiments
# make test's streams each deploy on a loopback network (three bytes) of their own, chosen when it
# starts among those no socket is bound on and no other make test holds (tests/loopbacks.py), and
# in a runs/ of their own: never the checkout's runs/ nor the default 127.0.0.1 and 127.0.1.x, so
# that a deployment of the user's keeps running beside it, and two make tests beside each other.
TEST_NETWORKS := 3
# What make test leaves to make test-scale (the scale marker, pytest.ini): every topology at 50
# services and the measurements' real runs. They were 169 of make test's 969 CPU-s on a fresh clone
# (2026-12-01), and make test, CPU-bound on two cores, took 476-528 s against the guide's 8 minutes.
NOT_SCALE := not scale

.PHONY: test test-streams
test: setup browser ## Run every test but the Kubernetes ones and those at scale (make test-scale): policy (every rule set), services, unit, integration (tests/integration/) and end-to-end against real processes
	@$(PY) -m tests.loopbacks $(TEST_NETWORKS) -- $(MAKE) --no-print-directory test-streams

test-streams: # make test's work, on the networks it holds (TEST_LOOPBACKS)
	@# Four streams side by side, their output shown when all are done; each pytest run names its 25 slowest.
	@# Each on a loopback network and in a runs/ of its own (COMPLYROUTE_LOOPBACK, COMPLYROUTE_RUNS:
	@# runtime/local/deployment.py):
	@# - The pooled end-to-end tests (the pool marker: tests/e2e/conftest.py), one deployment at a
	@#   time; then, on the same network (the pool's deployment stopped), the experiments' end-to-end
	@#   tests (tests/e2e/experiments/), which last as long as their load does, whatever the
	@#   machine's load, and so run when fewer streams are left; then the policy tests of every rule
	@#   set and the services' tests, which start no deployment: this stream, with half of the matrix
	@#   of topologies and engines in make test-scale, ended first, 100 s before the others (a fresh
	@#   clone of 6ed145b, 2026-12-02).
	@# - Beside them, the other end-to-end tests with a deployment, each their own, one at a time.
	@# - Beside them, the tests that start no deployment (unit and tests/integration/), on a pytest
	@#   worker per core as make check runs them: one alone was the run's tail, the machine half
	@#   idle behind it (a fresh clone of 5a90611: the others ended at 462-507 s, this pytest at 585 s).
	@# - Apart, at the lowest CPU priority: the end-to-end tests on addresses of their own and with no
	@#   deployment (own_network: the engines' differential test). Their processes starve there, so
	@#   their points take tests/e2e/helpers.py STARVED_MACHINE_TIMEOUTS: a test placed here needs them too.
	@# make test is CPU-bound on two cores; the deployments' streams mostly wait on their processes, and
	@# the lowest priority lets them have a core when they need one while the differential test (waiting
	@# for nothing) takes what is left.
	@test -n "$${TEST_LOOPBACKS:-}" || { echo "test-streams: run make test, which holds the loopback networks it runs on" >&2; exit 2; }; \
	set -- $$TEST_LOOPBACKS; pool_net=$$1; deployments_net=$$2; apart_net=$$3; \
	beside=$$(mktemp); others=$$(mktemp); apart=$$(mktemp); pool_runs=$$(mktemp -d); others_runs=$$(mktemp -d); runs=$$(mktemp -d); apart_runs=$$(mktemp -d); \
	$(PY) -m pytest $(NO_DEPLOYMENT) -m "$(NOT_SCALE)" -n auto --dist loadfile --no-loadscope-reorder -p no:cacheprovider --durations=25 >$$beside 2>&1 & pid=$$!; \
	COMPLYROUTE_LOOPBACK=$$deployments_net COMPLYROUTE_RUNS=$$others_runs \
	  $(PY) -m pytest $(E2E) --ignore=$(E2E_EXPERIMENTS) -m "not own_network and not pool and $(NOT_SCALE)" -p no:cacheprovider --durations=25 >$$others 2>&1 & others_pid=$$!; \
	COMPLYROUTE_LOOPBACK=$$apart_net COMPLYROUTE_RUNS=$$apart_runs nice -n 19 $(PY) -m pytest $(E2E) -m "own_network and $(NOT_SCALE)" -p no:cacheprovider --durations=25 >$$apart 2>&1 & own_pid=$$!; \
	echo "$(PY) -m pytest $(E2E) --ignore=$(E2E_EXPERIMENTS) -m 'pool and $(NOT_SCALE)' --durations=25 on $$pool_net.x, then pytest $(E2E_EXPERIMENTS) -m '$(NOT_SCALE)' there, then the policy tests and npm test  (beside them: pytest $(E2E) -m 'not own_network and not pool and $(NOT_SCALE)' on $$deployments_net.x; pytest $(NO_DEPLOYMENT); apart: nice pytest $(E2E) -m 'own_network and $(NOT_SCALE)' on $$apart_net.x)"; \
	e2e=0; COMPLYROUTE_LOOPBACK=$$pool_net COMPLYROUTE_RUNS=$$pool_runs $(PY) -m pytest $(E2E) --ignore=$(E2E_EXPERIMENTS) -m "pool and $(NOT_SCALE)" -p no:cacheprovider --durations=25 || e2e=$$?; \
	COMPLYROUTE_LOOPBACK=$$pool_net COMPLYROUTE_RUNS=$$runs $(PY) -m pytest $(E2E_EXPERIMENTS) -m "$(NOT_SCALE)" -p no:cacheprovider --durations=25 || e2e=1; \
	policies=0; $(MAKE) --no-print-directory policy-test || policies=1; \
	$(foreach rules,$(notdir $(wildcard rule-sets/*)),$(MAKE) --no-print-directory policy-test policy=$(rules) || policies=1;) \
	(cd services && npm test) || policies=1; \
	others_e2e=0; wait $$others_pid || others_e2e=$$?; rest=0; wait $$pid || rest=$$?; own=0; wait $$own_pid || own=$$?; \
	echo "--- the other end-to-end tests with a deployment, run beside them on $$deployments_net.x:"; cat $$others; \
	echo "--- the tests without a deployment, run beside them:"; cat $$beside; \
	echo "--- the end-to-end tests on addresses of their own, run beside them:"; cat $$apart; \
	rm -rf $$beside $$others $$apart $$pool_runs $$others_runs $$runs $$apart_runs; \
	test $$e2e -eq 0 -a $$policies -eq 0 -a $$others_e2e -eq 0 -a $$rest -eq 0 -a $$own -eq 0

.PHONY: test-scale test-scale-streams
test-scale: setup ## The tests make test leaves out (the scale marker): every topology deployed at 50 services, the compiled Kubernetes manifests at 50, and the bench's, a capacity search's and a soak's real runs; CI runs it after make test
	@$(PY) -m tests.loopbacks $(TEST_NETWORKS) -- $(MAKE) --no-print-directory test-scale-streams

test-scale-streams: # make test-scale's work, on the networks it holds (TEST_LOOPBACKS)
	@# Three streams side by side, each on a network and in a runs/ of its own, as make test's: the
	@# deployments of 50 services one after another; beside them the experiments' capacity search
	@# and soak, whose load lasts its time whatever the machine's; apart, at the lowest priority, the
	@# bench (own_network) and the Kubernetes manifests at 50 services (integration), which wait for
	@# nothing and take what CPU is left.
	@test -n "$${TEST_LOOPBACKS:-}" || { echo "test-scale-streams: run make test-scale, which holds the loopback networks it runs on" >&2; exit 2; }; \
	set -- $$TEST_LOOPBACKS; deployments_net=$$1; experiments_net=$$2; apart_net=$$3; \
	experiments=$$(mktemp); apart=$$(mktemp); deployments_runs=$$(mktemp -d); experiments_runs=$$(mktemp -d); apart_runs=$$(mktemp -d); \
	COMPLYROUTE_LOOPBACK=$$experiments_net COMPLYROUTE_RUNS=$$experiments_runs \
	  $(PY) -m pytest $(E2E_EXPERIMENTS) -m scale -p no:cacheprovider --durations=10 >$$experiments 2>&1 & experiments_pid=$$!; \
	COMPLYROUTE_LOOPBACK=$$apart_net COMPLYROUTE_RUNS=$$apart_runs nice -n 19 $(PY) -m pytest $(E2E) tests/integration -m "scale and (own_network or integration)" -p no:cacheprovider --durations=10 >$$apart 2>&1 & own_pid=$$!; \
	echo "$(PY) -m pytest $(E2E) --ignore=$(E2E_EXPERIMENTS) -m 'scale and not own_network' on $$deployments_net.x  (beside it: pytest $(E2E_EXPERIMENTS) -m scale on $$experiments_net.x; apart: nice pytest $(E2E) tests/integration -m 'scale and (own_network or integration)' on $$apart_net.x)"; \
	e2e=0; COMPLYROUTE_LOOPBACK=$$deployments_net COMPLYROUTE_RUNS=$$deployments_runs $(PY) -m pytest $(E2E) --ignore=$(E2E_EXPERIMENTS) -m "scale and not own_network" -p no:cacheprovider --durations=10 || e2e=$$?; \
	experiments_e2e=0; wait $$experiments_pid || experiments_e2e=$$?; own=0; wait $$own_pid || own=$$?; \
	echo "--- the experiments' tests at scale, run beside them on $$experiments_net.x:"; cat $$experiments; \
	echo "--- the tests at scale on addresses of their own or with no deployment, run beside them:"; cat $$apart; \
	rm -rf $$experiments $$apart $$deployments_runs $$experiments_runs $$apart_runs; \
	test $$e2e -eq 0 -a $$experiments_e2e -eq 0 -a $$own -eq 0

.PHONY: check
check: setup ## The quick loop (2 min 40 s cold on a fresh clone here, 2026-12-01, its tests at scale left out; 2 min 29 s with them on an idle machine the same day; 2 min 47 s to 4 min 30 s on 2026-11-30 as the shared host ran: OPA evaluating cold decision spaces is much of it; the aim is 3): policy lint and tests, the services' tests, the unit and integration tests (tests/unit/, tests/integration/; make test runs those and e2e/, not k8s/; neither runs those at scale, which make test-scale does)
	@# One pytest worker per core (pytest-xdist), each given whole files: a file's module-scoped
	@# fixtures (a render of 50 services, a policy diff) are built once, not once per worker. The
	@# files in NO_DEPLOYMENT's order (xdist would order them by their number of tests).
	@# Beside them, one after the other, the policy tests and the services' tests (half a minute
	@# of CPU that waited for nothing but held pytest back); their output is shown when pytest is done.
	@beside=$$(mktemp); \
	( rest=0; $(MAKE) --no-print-directory policy-test || rest=1; (cd services && npm test) || rest=1; exit $$rest ) >$$beside 2>&1 & pid=$$!; \
	echo "$(PY) -m pytest $(NO_DEPLOYMENT) -m '$(NOT_SCALE)' -n auto --dist loadfile --no-loadscope-reorder -p no:cacheprovider --durations=25  (beside it: make policy-test, npm test)"; \
	tests=0; $(PY) -m pytest $(NO_DEPLOYMENT) -m "$(NOT_SCALE)" -n auto --dist loadfile --no-loadscope-reorder -p no:cacheprovider --durations=25 || tests=$$?; \
	rest=0; wait $$pid || rest=$$?; \
	echo "--- the policy and services' tests, run beside them:"; cat $$beside; rm -f $$beside; \
	test $$tests -eq 0 -a $$rest -eq 0

.PHONY: integration
integration: setup ## The integration tests alone (tests/integration/: real OPA, Envoy and kubernetes-validate over whole topologies, no deployment; make test runs them too)
	$(PY) -m pytest tests/integration -p no:cacheprovider --durations=25
