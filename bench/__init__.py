"""agentfast benchmark: pause/resume latency and storage per paused run.

`make bench` (= `python -m bench`) measures, on a fresh database of its own, the one flow
that matters for the engine's cost: a run whose model at once proposes one gated tool call
(`send_email`, risk high, hitl_mode suspend), so it pauses; a reviewer approves; the run
resumes and the tool writes one SideEffect row.

- SQLite by default (var/bench/agentfast.sqlite3, recreated each time);
- PostgreSQL when DATABASE_URL=postgres://…/<name with "bench"> (dropped and recreated).

Everything the bench creates lives in var/bench/: the config file, the SQLite database,
the embedded Redis and the Celery worker's log. Modules:

- bench.setup: environment, fresh database, embedded Redis, the worker subprocess;
- bench.instrument: query/transaction recorder (execute_wrapper + on_commit hooks);
- bench.storage: rows and bytes of one run, storage growth;
- bench.measure: the timed passes;
- bench.report: the table and the JSON.
"""
