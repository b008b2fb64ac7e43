##@ Housekeeping
.PHONY: clean
clean: ## Remove run folders (not the installed tools)
	rm -rf runs

.PHONY: distclean
distclean: clean ## Remove run folders and everything `make setup` installed
	rm -rf bin .venv services/node_modules tools/node/node_modules
