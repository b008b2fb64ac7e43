"""A deployment on this machine: what each part runs, written into the run folder (rendering.py);
every part a process under one supervisord (supervision.py); the deployment's life, its state,
deploy, status and undeploy (deployment.py); a new rule set into the running points (reload.py);
and faults injected into its parts (faults.py). target.py is all of it as the runtime's Target."""
