##@ Testing
# The tiers are folders, each test marked from its own (tests/conftest.py): the two that start no
# deployment, which make check runs, and the end-to-end one. The integration tests first: make
# check's workers take files in this order, the costly ones (a minute of CPU and more) first and
# the many small unit files last, to even out their ends.
NO_DEPLOYMENT := tests/integration tests/unit
E2E := tests/e2e
E2E_EXPERIMENTS := tests/e2e/experiments
# The experiments' test that runs beside the other experiments' tests, on the pool's network (below).
E2E_CAPACITY := $(E2E_EXPERIMENTS)/test_capacity_e2e.py
# make test's streams each deploy on a loopback network (three bytes) of their own, chosen when it
# starts among those no socket is bound on and no other make test holds (tests/loopbacks.py), and
# in a runs/ of their own: never the checkout's runs/ nor the default 127.0.0.1 and 127.0.1.x, so
# that a deployment of the user's keeps running beside it, and two make tests beside each other.
TEST_NETWORKS := 4

.PHONY: test test-streams
test: setup browser ## Run every test but the Kubernetes ones: policy (every rule set), services, unit, integration (tests/integration/) and end-to-end against real processes
	@$(PY) -m tests.loopbacks $(TEST_NETWORKS) -- $(MAKE) --no-print-directory test-streams

test-streams: # make test's work, on the networks it holds (TEST_LOOPBACKS)
	@# Four streams side by side, their output shown when all are done; each pytest run names its 25 slowest.
	@# Each on a loopback network and in a runs/ of its own (COMPLYROUTE_LOOPBACK, COMPLYROUTE_RUNS:
	@# runtime/local/deployment.py):
	@# - The pooled end-to-end tests (the pool marker: tests/e2e/conftest.py), one deployment at a
	@#   time; then the experiments' end-to-end tests (tests/e2e/experiments/), and beside them, on
	@#   the pool's network (its deployment stopped), their capacity test. The experiments' tests
	@#   last as long as their load does, whatever the machine's load: one after the other they
	@#   were the run's tail, and run after the other deployments' tests the capacity test was
	@#   (a fresh clone on 2026-11-30: those ended at 488 s, the capacity test at 532 s, the
	@#   experiments' at 442 s).
	@# - Beside them, the other end-to-end tests with a deployment, each their own, one at a time.
	@# - Beside them, one after another: the policy tests of every rule set, the services' tests and the
	@#   tests that start no deployment (unit and tests/integration/), on a pytest worker per core
	@#   as make check runs them: one alone was the run's tail, the machine half idle behind it
	@#   (a fresh clone of 5a90611: the others ended at 462-507 s, this pytest at 585 s).
	@# - Apart, at the lowest CPU priority: the end-to-end tests on addresses of their own and with no
	@#   deployment (own_network: the engines' differential test, the bench). Their processes starve
	@#   there (the bench's 58 CPU-s took 513-736 s of wall in three fresh clones of 870fd83), so
	@#   their points take tests/e2e/helpers.py STARVED_MACHINE_TIMEOUTS: a test placed here needs them too.
	@# make test is CPU-bound on two cores; the deployments' streams mostly wait on their processes, and
	@# the lowest priority lets them have a core when they need one while the differential test and the
	@# bench (waiting for nothing) take what is left; the experiments' tests, which count their sends on
	@# time, run at the normal priority, after the pool, when fewer streams are left.
	@test -n "$${TEST_LOOPBACKS:-}" || { echo "test-streams: run make test, which holds the loopback networks it runs on" >&2; exit 2; }; \
	set -- $$TEST_LOOPBACKS; pool_net=$$1; experiments_net=$$2; deployments_net=$$3; apart_net=$$4; \
	beside=$$(mktemp); others=$$(mktemp); apart=$$(mktemp); capacity=$$(mktemp); pool_runs=$$(mktemp -d); others_runs=$$(mktemp -d); runs=$$(mktemp -d); apart_runs=$$(mktemp -d); capacity_runs=$$(mktemp -d); \
	( rest=0; \
	  $(MAKE) --no-print-directory policy-test || rest=1; \
	  $(foreach rules,$(notdir $(wildcard rule-sets/*)),$(MAKE) --no-print-directory policy-test policy=$(rules) || rest=1;) \
	  (cd services && npm test) || rest=1; \
	  $(PY) -m pytest $(NO_DEPLOYMENT) -n auto --dist loadfile --no-loadscope-reorder -p no:cacheprovider --durations=25 || rest=1; \
	  exit $$rest ) >$$beside 2>&1 & pid=$$!; \
	COMPLYROUTE_LOOPBACK=$$deployments_net COMPLYROUTE_RUNS=$$others_runs \
	  $(PY) -m pytest $(E2E) --ignore=$(E2E_EXPERIMENTS) -m "not own_network and not pool" -p no:cacheprovider --durations=25 >$$others 2>&1 & others_pid=$$!; \
	COMPLYROUTE_LOOPBACK=$$apart_net COMPLYROUTE_RUNS=$$apart_runs nice -n 19 $(PY) -m pytest $(E2E) -m own_network -p no:cacheprovider --durations=25 >$$apart 2>&1 & own_pid=$$!; \
	echo "$(PY) -m pytest $(E2E) --ignore=$(E2E_EXPERIMENTS) -m pool --durations=25 on $$pool_net.x, then pytest $(E2E_EXPERIMENTS) --ignore=$(E2E_CAPACITY) on $$experiments_net.x and beside it pytest $(E2E_CAPACITY) on $$pool_net.x  (beside them: pytest $(E2E) -m 'not own_network and not pool' on $$deployments_net.x; policy tests, npm test, pytest $(NO_DEPLOYMENT); apart: nice pytest $(E2E) -m own_network on $$apart_net.x)"; \
	e2e=0; COMPLYROUTE_LOOPBACK=$$pool_net COMPLYROUTE_RUNS=$$pool_runs $(PY) -m pytest $(E2E) --ignore=$(E2E_EXPERIMENTS) -m pool -p no:cacheprovider --durations=25 || e2e=$$?; \
	COMPLYROUTE_LOOPBACK=$$pool_net COMPLYROUTE_RUNS=$$capacity_runs $(PY) -m pytest $(E2E_CAPACITY) -p no:cacheprovider --durations=25 >$$capacity 2>&1 & capacity_pid=$$!; \
	COMPLYROUTE_LOOPBACK=$$experiments_net COMPLYROUTE_RUNS=$$runs $(PY) -m pytest $(E2E_EXPERIMENTS) --ignore=$(E2E_CAPACITY) -p no:cacheprovider --durations=25 || e2e=1; \
	wait $$capacity_pid || e2e=1; echo "--- the experiments' capacity test, run beside them on $$pool_net.x:"; cat $$capacity; \
	others_e2e=0; wait $$others_pid || others_e2e=$$?; rest=0; wait $$pid || rest=$$?; own=0; wait $$own_pid || own=$$?; \
	echo "--- the other end-to-end tests with a deployment, run beside them on $$deployments_net.x:"; cat $$others; \
	echo "--- the policy, services' tests and the tests without a deployment, run beside them:"; cat $$beside; \
	echo "--- the end-to-end tests on addresses of their own, run beside them:"; cat $$apart; \
	rm -rf $$beside $$others $$apart $$capacity $$pool_runs $$others_runs $$runs $$apart_runs $$capacity_runs; \
	test $$e2e -eq 0 -a $$others_e2e -eq 0 -a $$rest -eq 0 -a $$own -eq 0

.PHONY: check
check: setup ## The quick loop (2 min 29 s cold on a fresh clone of b4a2103 on an idle machine here, 2026-12-01; 2 min 47 s to 4 min 30 s on 2026-11-30 as the shared host ran: OPA evaluating cold decision spaces is much of it; the aim is 3): policy lint and tests, the services' tests, the unit and integration tests (tests/unit/, tests/integration/; make test runs those and e2e/, not k8s/)
	@# One pytest worker per core (pytest-xdist), each given whole files: a file's module-scoped
	@# fixtures (a render of 50 services, a policy diff) are built once, not once per worker. The
	@# files in NO_DEPLOYMENT's order (xdist would order them by their number of tests).
	@# Beside them, one after the other, the policy tests and the services' tests (half a minute
	@# of CPU that waited for nothing but held pytest back); their output is shown when pytest is done.
	@beside=$$(mktemp); \
	( rest=0; $(MAKE) --no-print-directory policy-test || rest=1; (cd services && npm test) || rest=1; exit $$rest ) >$$beside 2>&1 & pid=$$!; \
	echo "$(PY) -m pytest $(NO_DEPLOYMENT) -n auto --dist loadfile --no-loadscope-reorder -p no:cacheprovider --durations=25  (beside it: make policy-test, npm test)"; \
	tests=0; $(PY) -m pytest $(NO_DEPLOYMENT) -n auto --dist loadfile --no-loadscope-reorder -p no:cacheprovider --durations=25 || tests=$$?; \
	rest=0; wait $$pid || rest=$$?; \
	echo "--- the policy and services' tests, run beside them:"; cat $$beside; rm -f $$beside; \
	test $$tests -eq 0 -a $$rest -eq 0

.PHONY: integration
integration: setup ## The integration tests alone (tests/integration/: real OPA, Envoy and kubernetes-validate over whole topologies, no deployment; make test runs them too)
	$(PY) -m pytest tests/integration -p no:cacheprovider --durations=25
