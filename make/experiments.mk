##@ Experiments
.PHONY: experiment
experiment: setup ## Quick run of the paper's experiment (every topology under both engines and the baseline, 100 and 500 req/s, 5 and 10 services; the bench first): about 28-34 minutes here; capacity=RUN prices enforcement in a capacity run's share of the baseline's
	$(PY) -m experiments run --profile quick$(if $(capacity), --capacity $(capacity))

.PHONY: experiment-classification
experiment-classification: setup ## One quick cell of the experiment under the second rule set (rule-sets/classification, its record mix) beside the baseline: about 2 minutes
	$(PY) -m experiments run --profile quick --policy classification --mix classification --topologies dr3 --engines envoy-opa --rates 100 --services 5 --repetitions 1 --bench-rounds 0

.PHONY: bench
bench: setup ## CPU per request of each part of a hop (service, Envoy, OPA, compiled engine) beside its floor, one run; writes CSV
	$(PY) -m experiments bench
