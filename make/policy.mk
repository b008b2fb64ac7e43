##@ Policy authoring
.PHONY: policy-test
policy-test: check-policy $(OPA) $(REGAL) $(VENV)/.installed ## Format check, strict check, Regal lint and unit tests with coverage of policies/ [policy=<rule set>]
	$(OPA) fmt --list --fail $(policy_dir)
	$(CONTROL) policy-check --opa $(OPA) --regal $(REGAL) $(policy_dir)
	$(CONTROL) policy-test --opa $(OPA) --threshold 95 $(policy_dir)

.PHONY: decide
decide: check-policy $(OPA) $(VENV)/.installed ## Show the decision for one input: make decide input=policies/examples/eu-health-denied.json [policy=<rule set> catalog=...]
	$(CONTROL) decide --opa $(OPA) --input $(input) --catalog $(catalog) --policies $(policy)

.PHONY: policy-diff
policy-diff: check-base check-topology $(OPA) $(VENV)/.installed ## Every decision policies/ would make differently from a git ref, at each point of the walkthrough (make demo's): make policy-diff base=HEAD [topology=ce] [services=N]
	$(CONTROL) policy-diff --base='$(base)' --policies $(policy) $(if $(filter command line,$(origin topology)),--topology $(topology_file)) $(if $(services),--services $(services))

.PHONY: policy-bench
policy-bench: setup ## What one decision costs at each topology's enforcement points, allowed and denied, against commit d2d81e4's rule set (opa bench: about a minute once the cases' allowed tables are built and cached; a fresh clone builds them first, 5 to 7 minutes here beside other work)
	$(CONTROL) policy-bench
