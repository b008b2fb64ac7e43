##@ Deploying (processes on this machine, or target=k8s)
.PHONY: deploy
deploy: check-topology check-target check-engine check-watch check-restart check-image check-policy setup ## Start a topology: make topology=sidecar services=5 [engine=envoy-compiled] deploy [target=k8s [image=<service image>] [one_node=1: every pod on the node labelled complyroute.io/role=all]] [watch=1: then reload on every save to policies/] [restart=0: a part that dies stays down]
	$(CONTROL) deploy --target $(target) $(policy_given) --topology $(topology_file) $(if $(services),--services $(services)) $(if $(engine),--engine $(engine)) $(if $(filter 0,$(restart)),--no-restart) $(if $(image),--image '$(image)') $(if $(filter 1,$(one_node)),--one-node)
	$(if $(filter 1,$(watch)),$(CONTROL) watch-policy $(policy_given))

.PHONY: reload-policy
reload-policy: check-target setup ## Apply policies/ to the running deployment, restarting nothing; returns once every point decides with the new revision [target=k8s topology=<t>: update the bundle and route ConfigMaps only, rolling no pod; does not wait]
	$(if $(filter k8s,$(target)),$(if $(topology_file),,$(error topology '$(topology)' is unknown: name the topology deployed with target=k8s)))
	$(CONTROL) reload-policy --target $(target) $(if $(filter k8s,$(target)),--topology $(topology_file)) $(policy_given)

.PHONY: watch-policy
watch-policy: setup ## Reload the running deployment whenever a file of its rule set changes (Ctrl-C stops watching) [policy=<rule set>]
	$(CONTROL) watch-policy $(policy_given)

.PHONY: undeploy
undeploy: check-target ## Stop everything the current deployment started [target=k8s: delete its namespaces]
	$(CONTROL) undeploy --target $(target)

.PHONY: status
status: check-target ## Show the parts of the current deployment: whether each is healthy, its supervisord state and how often it was restarted [target=k8s: the pods of the topologies deployed to the current kubectl context (topology=<t>: its only), ready and restarts]
	$(if $(and $(filter k8s,$(target)),$(filter command line,$(origin topology))),$(if $(topology_file),,$(error topology '$(topology)' is unknown: name the topology deployed with target=k8s, or leave it out)))
	$(CONTROL) status --target $(target) $(if $(and $(filter k8s,$(target)),$(filter command line,$(origin topology))),--topology $(topology_file))

.PHONY: audit
audit: check-target setup ## Check the audit lines of every run under runs/ (or runs="runs/a runs/b"): chains intact, no forbidden reception, none without a decision, every record's path whole
	$(CONTROL) audit --target $(target) $(runs)
