"""The external-agent gate: agents that run elsewhere ask, wait, claim and report over HTTP."""
