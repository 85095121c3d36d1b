"""`python -m bench.compare`: agentfast against LangGraph with its Postgres checkpointer, same flow, same Postgres.

The flow: one model turn proposing one gated call (send_email), pause, approve, the call runs
(one side-effect row), a second model turn, final answer.

  round trip     in process, alternating agentfast and LangGraph round by round: start → paused
                 (committed) → approve → the run completed. agentfast: services.run_create +
                 runtime.drive with the demo model; LangGraph: StateGraph + PostgresSaver,
                 interrupt() for the pause, Command(resume=…) for the approval, a scripted model.
  bytes/paused   agentfast: the rows of a paused run (sum of pg_column_size) and the growth of the
                 agents_* tables per paused run; LangGraph: the same of the checkpoint tables per
                 paused thread.
  throughput     both against one local OpenAI-compatible server answering every turn after
                 --delay s. LangGraph: asyncio, AsyncPostgresSaver on a connection pool, --runs runs
                 at once, approved in process as they pause. agentfast: its real processes (one
                 daphne, --workers celery workers), runs started and approved over the HTTP API
                 as they pause. Prints runs/s, model requests in flight (max) and
                 decision → side effect p95.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Annotated, Any, Self, TypedDict
from urllib.parse import unquote, urlsplit

from bench import setup

try:  # LangGraph passes the run's config to a node only if the parameter is typed so
    from langchain_core.runnables import RunnableConfig
except ImportError:  # the `bench` extra is missing: main() says so
    RunnableConfig = dict  # type: ignore[assignment,misc]

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/agentfast_bench_compare"
ARGS = {"to": "bob@example.com", "subject": "Your refund", "body": "Your refund is on its way."}
LG_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")
FINAL = "The email is sent."


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100, help="in-process round trips of each (default 100)")
    parser.add_argument("--paused", type=int, default=50, help="paused runs measured for storage (default 50)")
    parser.add_argument("--runs", type=int, default=40, help="runs of the throughput pass, each (default 40)")
    parser.add_argument("--workers", type=int, default=2, help="agentfast celery workers (default 2)")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="threads per agentfast worker (default: `agentfast worker`'s own; 1: the solo pool)",
    )
    parser.add_argument(
        "--fail-rate",
        type=float,
        default=0.0,
        help="share of agentfast's model requests answered 500 (e.g. 0.1); counts runs lost and doubled",
    )
    parser.add_argument("--delay", type=float, default=0.5, help="seconds the model takes per turn (default 0.5)")
    parser.add_argument("--pool", type=int, default=20, help="LangGraph's async connection pool size (default 20)")
    parser.add_argument(
        "--durability", choices=("sync", "async", "exit"), default="sync", help="LangGraph's durability (default sync)"
    )
    parser.add_argument("--no-throughput", action="store_true", help="skip the throughput pass")
    parser.add_argument(
        "--throughput-only", action="store_true", help="only the throughput pass (no round trip, no storage)"
    )
    parser.add_argument("--approvers", type=int, default=4, help="threads the approving client decides on (default 4)")
    parser.add_argument(
        "--sqlite",
        action="store_true",
        help="agentfast's processes on SQLite (var/bench); LangGraph stays on DATABASE_URL's Postgres. Implies "
        "--throughput-only",
    )
    parser.add_argument(
        "--scale-out",
        action="store_true",
        help="the workers as separate machines (own var/ folders, shared Postgres and Redis); prints their split",
    )
    parser.add_argument("--skip-langgraph", action="store_true", help="agentfast's throughput only (quick loops)")
    args = parser.parse_args(argv)
    if args.sqlite:
        args.throughput_only = True
        if args.scale_out:
            parser.error("--scale-out needs Postgres: two machines cannot share a SQLite file")
    if min(args.rounds, args.paused, args.runs, args.workers, args.pool, args.approvers, args.concurrency or 1) < 1:
        parser.error("--rounds, --paused, --runs, --workers, --approvers and --pool must be at least 1")
    if not 0 <= args.fail_rate < 1:
        parser.error("--fail-rate must be in [0, 1)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    postgres_url = os.environ.get("DATABASE_URL") or DEFAULT_URL
    if urlsplit(postgres_url).scheme not in {"postgres", "postgresql"}:
        print("bench: the comparison needs PostgreSQL (DATABASE_URL=postgres://…/<name with 'bench'>)", file=sys.stderr)
        return 1
    # agentfast's processes use DATABASE_URL; with --sqlite a fresh file under var/bench instead.
    os.environ["DATABASE_URL"] = f"sqlite:///{setup.VAR_DIR / 'compare-bench.sqlite3'}" if args.sqlite else postgres_url
    try:
        import langgraph.checkpoint.postgres  # noqa: F401
    except ImportError:
        print("bench: LangGraph is missing: pip install -e '.[bench]'", file=sys.stderr)
        return 1
    return setup.run(_main, args, postgres_url)


def _main(args: argparse.Namespace, postgres_url: str) -> int:
    target = setup.prepare()
    if args.sqlite:  # LangGraph's database is fresh too (prepare() made agentfast's)
        setup.recreate_postgres(postgres_url)
    model = SlowModel(args.delay).start()
    try:
        (setup.VAR_DIR / "bench.yaml").write_text(_config(model.base_url))
        setup.start_redis()
        with setup.django_migrated(target):
            print(render(_run(args, target, model, _conninfo(postgres_url))))
    finally:
        setup.stop_workers()  # before the model they call
        model.stop()
    return 0


def _config(base_url: str) -> str:
    """The bench's config plus agent "slow": the same gated tool behind the slow endpoint."""
    slow = (
        "  slow:\n"
        "    description: Benchmark agent behind a slow OpenAI-compatible endpoint.\n"
        "    model: openai:test-model\n"
        f"    base_url: {base_url}\n"
        "    system_prompt: You are a customer-support agent.\n"
        "    tools: [send_email]\n"
        "    max_steps: 10\n"
    )
    return setup.CONFIG.replace("tool_overrides:", slow + "tool_overrides:")


def progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


# -- the slow model endpoint ----------------------------------------------------------------


class SlowModel:
    """The tests' OpenAI-compatible server, answering every turn after `delay` s; counts requests in flight."""

    def __init__(self, delay: float) -> None:
        from tests.support.fake_openai import FakeOpenAI

        self.delay = delay
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.fail_rate = 0.0
        self.failed = 0
        self.rng = random.Random(12)
        self.server = FakeOpenAI(respond=self._respond)
        self.server.httpd.request_queue_size = 1024  # a thousand clients may connect at once

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def start(self) -> SlowModel:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def reset(self) -> None:
        self.server.reset()
        with self.lock:
            self.max_in_flight = self.in_flight
            self.failed = 0

    def _respond(self, body: dict[str, Any]) -> Any:
        from tests.support.fake_openai import Reply, tool_messages

        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            time.sleep(self.delay)  # counted while it "thinks"
        finally:
            with self.lock:
                self.in_flight -= 1
                fail = self.rng.random() < self.fail_rate
                self.failed += fail
        if fail:
            return Reply(status=500, content="the bench's model failed this request on purpose")
        if tool_messages(body):
            return Reply(content=FINAL)
        return Reply(tool_calls=[("call_1", "send_email", json.dumps(ARGS))])


# -- the passes -----------------------------------------------------------------------------


def _run(args: argparse.Namespace, target: setup.Target, model: SlowModel, conninfo: str) -> dict[str, Any]:
    started = time.perf_counter()
    results: dict[str, Any] = {} if args.throughput_only else _in_process(args, conninfo)
    if not args.no_throughput:
        if not args.skip_langgraph:
            progress(f"throughput, LangGraph async: {args.runs} runs at once, model answering after {args.delay} s")
            model.reset()
            results["lg_throughput"] = asyncio.run(_langgraph_async(conninfo, args, model))
        progress(
            f"throughput, agentfast on {target.engine}: `agentfast serve` + {args.workers} × `agentfast worker`"
            f"{'' if args.concurrency is None else f' --concurrency={args.concurrency}'}"
            f"{' (separate machines)' if args.scale_out else ''}, {args.runs} runs over the HTTP API, "
            f"{args.approvers} approver threads, {args.fail_rate:.0%} of model requests failing"
        )
        model.reset()
        model.fail_rate = args.fail_rate
        results["af_throughput"] = _agentfast_throughput(args, model)
    results["meta"] = {
        "database": target.label,
        "cpus": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
        "seconds": time.perf_counter() - started,
        "args": vars(args),
    }
    return results


def _in_process(args: argparse.Namespace, conninfo: str) -> dict[str, Any]:
    """The round trip and the bytes per paused run, in this process, both on the same Postgres."""
    from bench import measure

    measure.check_flow()
    results: dict[str, Any] = {}
    with LangGraphSync(conninfo, args.durability) as lg, WriteMeter(conninfo) as writes:
        lg.check_flow()
        progress(f"round trip in process: {args.rounds} rounds of each, alternating (+10 warm-up)")
        af_rt, lg_rt, af_cpu, lg_cpu = [], [], [], []
        for index in range(10 + args.rounds):
            counted = index >= 10
            with writes.of("agentfast", counted):
                af, afc = _cpu_and_wall(_agentfast_round_trip)
            with writes.of("langgraph", counted):
                lgt, lgc = _cpu_and_wall(lambda index=index: lg.round_trip(f"rt-{index}"))
            if counted:
                af_rt.append(af)
                lg_rt.append(lgt)
                af_cpu.append(afc)
                lg_cpu.append(lgc)
        results["round_trip"] = {"agentfast": measure.summary(af_rt), "langgraph": measure.summary(lg_rt)}
        # CPU of this process (all its threads) per round trip: steadier than wall time on a busy machine.
        results["round_trip_cpu"] = {"agentfast": measure.summary(af_cpu), "langgraph": measure.summary(lg_cpu)}
        results["round_trip_writes"] = writes.per_round_trip()
        progress(f"bytes per paused run: {args.paused} paused runs of each")
        results["storage"] = {"agentfast": _agentfast_storage(args.paused), "langgraph": lg.storage(args.paused)}
    return results


class WriteMeter:
    """What a round trip asks PostgreSQL to make durable: WAL bytes and write transactions.

    Read between round trips from a connection of its own, outside their clocks: the WAL
    position (`pg_current_wal_lsn`) and the next transaction id, which only a transaction
    that writes takes (read from a snapshot, which takes none). Both are the server's, so
    anything else writing meanwhile (autovacuum) counts too: little beside a round trip's.
    """

    _NEXT_XID = "pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
    NOW = f"SELECT pg_current_wal_lsn()::text, {_NEXT_XID}"
    SINCE = f"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn), {_NEXT_XID}"

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.totals: dict[str, list[float]] = {}  # engine → [round trips, WAL bytes, write transactions]

    def __enter__(self) -> Self:
        import psycopg

        self.connection = psycopg.connect(self.conninfo, autocommit=True)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.connection.close()

    @contextmanager
    def of(self, engine: str, counted: bool) -> Iterator[None]:
        lsn, xid = self.connection.execute(self.NOW).fetchone()  # type: ignore[misc]
        yield
        if not counted:
            return
        wal, after = self.connection.execute(self.SINCE, [lsn]).fetchone()  # type: ignore[misc]
        total = self.totals.setdefault(engine, [0.0, 0.0, 0.0])
        total[0] += 1
        total[1] += float(wal)
        total[2] += after - xid

    def per_round_trip(self) -> dict[str, dict[str, float]]:
        return {
            engine: {"wal_bytes": wal / n, "write_transactions": xacts / n}
            for engine, (n, wal, xacts) in self.totals.items()
        }


def _conninfo(url: str) -> str:
    parts = urlsplit(url)
    user = unquote(parts.username or "postgres")
    password = f":{unquote(parts.password)}" if parts.password else ""
    host = parts.hostname or "127.0.0.1"
    return f"postgresql://{user}{password}@{host}:{parts.port or 5432}/{unquote(parts.path.lstrip('/'))}"


def _cpu_and_wall(round_trip: Callable[[], float]) -> tuple[float, float]:
    """Run one round trip; return its wall time (as it measures it) and this process's CPU ms during it."""
    cpu = time.process_time()
    wall = round_trip()
    return wall, (time.process_time() - cpu) * 1000.0


def _agentfast_round_trip() -> float:
    from bench import measure

    t0 = time.perf_counter()
    run_id = measure.paused_run()
    measure.decide(run_id, auto_resume=False)
    measure.resume(run_id)
    return measure.ms(time.perf_counter() - t0)


def _agentfast_storage(paused: int) -> dict[str, float]:
    from bench import storage

    before = storage.storage_totals()["total_relation_bytes"]
    run_ids = [_paused() for _ in range(paused)]
    _checkpoint()
    after = storage.storage_totals()["total_relation_bytes"]
    rows = [sum(u.bytes for u in storage.run_usage(run_id)[0].values()) for run_id in run_ids]
    return {"row_bytes": sum(rows) / len(rows), "growth_bytes": (after - before) / paused}


def _paused() -> str:
    from bench import measure

    return measure.paused_run()


def _checkpoint() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")


# -- LangGraph --------------------------------------------------------------------------------


class State(TypedDict):
    messages: Annotated[list[dict[str, Any]], operator.add]


def _route(state: State) -> str:
    return "tools" if state["messages"][-1].get("tool_calls") else "__end__"


def _scripted_model(state: State) -> dict[str, Any]:
    """The demo model's script: propose send_email, then answer once its result is in."""
    if any(m["role"] == "tool" for m in state["messages"]):
        return {"messages": [{"role": "assistant", "content": FINAL}]}
    call = {"id": "call_1", "type": "function", "function": {"name": "send_email", "arguments": json.dumps(ARGS)}}
    return {"messages": [{"role": "assistant", "content": "", "tool_calls": [call]}]}


def _build(model_node: Any, tools_node: Any, checkpointer: Any) -> Any:
    from langgraph.graph import START, StateGraph

    graph = StateGraph(State)
    graph.add_node("model", model_node)
    graph.add_node("tools", tools_node)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", _route, ["tools", "__end__"])
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=checkpointer)


EFFECT_DDL = (
    "CREATE TABLE IF NOT EXISTS lg_side_effect (idempotency_key text PRIMARY KEY, arguments jsonb NOT NULL, "
    "created_at timestamptz NOT NULL DEFAULT now())"
)
EFFECT_SQL = "INSERT INTO lg_side_effect (idempotency_key, arguments) VALUES (%s, %s) ON CONFLICT DO NOTHING"


class LangGraphSync:
    """LangGraph in process with PostgresSaver; the side effect is one committed row, like agentfast's."""

    def __init__(self, conninfo: str, durability: str) -> None:
        self.conninfo = conninfo
        self.durability = durability

    def __enter__(self) -> Self:
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver

        self._saver_cm = PostgresSaver.from_conn_string(self.conninfo)
        saver = self._saver_cm.__enter__()
        saver.setup()
        self.effects = psycopg.connect(self.conninfo, autocommit=True)
        self.effects.execute(EFFECT_DDL)
        self.graph = _build(_scripted_model, self._tools, saver)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.effects.close()
        self._saver_cm.__exit__(*exc_info)

    def _tools(self, state: State, config: RunnableConfig) -> dict[str, Any]:
        from langgraph.types import interrupt

        call = state["messages"][-1]["tool_calls"][0]
        decision = interrupt({"tool": call["function"]["name"], "arguments": call["function"]["arguments"]})
        if decision != "approved":
            return {"messages": [{"role": "tool", "tool_call_id": call["id"], "content": '{"error": "rejected"}'}]}
        key = f"{config['configurable']['thread_id']}:{call['id']}"
        self.effects.execute(EFFECT_SQL, [key, call["function"]["arguments"]])
        result = {"message_id": f"msg_{key}", "status": "sent"}
        return {"messages": [{"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)}]}

    def pause(self, thread: str) -> None:
        config = {"configurable": {"thread_id": thread}}
        out = self.graph.invoke(
            {"messages": [{"role": "user", "content": setup.PROMPT}]}, config, durability=self.durability
        )
        if "__interrupt__" not in out:
            raise setup.BenchError(f"LangGraph thread {thread} did not pause: {out}")

    def approve(self, thread: str) -> None:
        from langgraph.types import Command

        config = {"configurable": {"thread_id": thread}}
        out = self.graph.invoke(Command(resume="approved"), config, durability=self.durability)
        if out["messages"][-1].get("content") != FINAL:
            raise setup.BenchError(f"LangGraph thread {thread} did not finish: {out['messages'][-1]}")

    def round_trip(self, thread: str) -> float:
        t0 = time.perf_counter()
        self.pause(thread)
        self.approve(thread)
        return (time.perf_counter() - t0) * 1000.0

    def check_flow(self) -> None:
        self.pause("check")
        self.approve("check")
        rows = self.effects.execute("SELECT count(*) FROM lg_side_effect WHERE idempotency_key LIKE 'check:%'")
        if rows.fetchone()[0] != 1:
            raise setup.BenchError("LangGraph's flow did not record exactly one side effect")

    def storage(self, paused: int) -> dict[str, float]:
        before = self._total()
        threads = [f"paused-{n}" for n in range(paused)]
        for thread in threads:
            self.pause(thread)
        self.effects.execute("CHECKPOINT")
        after = self._total()
        row_bytes = 0
        for table in LG_TABLES:
            cur = self.effects.execute(
                f"SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM {table} t WHERE thread_id = ANY(%s)", [threads]
            )
            row_bytes += int(cur.fetchone()[0])
        return {"row_bytes": row_bytes / paused, "growth_bytes": (after - before) / paused}

    def _total(self) -> int:
        cur = self.effects.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c WHERE c.relkind = 'r' "
            "AND c.relname = ANY(%s)",
            [list(LG_TABLES)],
        )
        return int(cur.fetchone()[0])


async def _langgraph_async(conninfo: str, args: argparse.Namespace, model: SlowModel) -> dict[str, Any]:
    """N runs at once in one asyncio loop; each approved in process as soon as it pauses."""
    import httpx
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from langgraph.types import Command, interrupt
    from openai import AsyncOpenAI
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    from bench import measure

    limits = httpx.Limits(max_connections=args.runs + 10, max_keepalive_connections=args.runs + 10)
    client = AsyncOpenAI(
        base_url=model.base_url, api_key="not-needed", http_client=httpx.AsyncClient(limits=limits, timeout=120)
    )
    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    effect_at: dict[str, float] = {}

    async with AsyncConnectionPool(conninfo, max_size=args.pool, kwargs=kwargs, open=False) as pool:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        async with pool.connection() as conn:  # made by the in-process pass, unless --throughput-only
            await conn.execute(EFFECT_DDL)

        async def model_node(state: State) -> dict[str, Any]:
            tools = [{"type": "function", "function": {"name": "send_email", "parameters": {"type": "object"}}}]
            reply = await client.chat.completions.create(model="test-model", messages=state["messages"], tools=tools)
            message = reply.choices[0].message
            out: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
            if message.tool_calls:
                out["tool_calls"] = [call.model_dump(include={"id", "type", "function"}) for call in message.tool_calls]
            return {"messages": [out]}

        async def tools_node(state: State, config: RunnableConfig) -> dict[str, Any]:
            call = state["messages"][-1]["tool_calls"][0]
            decision = interrupt({"tool": call["function"]["name"], "arguments": call["function"]["arguments"]})
            key = f"{config['configurable']['thread_id']}:{call['id']}"
            if decision == "approved":
                async with pool.connection() as conn:
                    await conn.execute(EFFECT_SQL, [key, call["function"]["arguments"]])
                effect_at[key] = time.perf_counter()
            return {"messages": [{"role": "tool", "tool_call_id": call["id"], "content": '{"status": "sent"}'}]}

        graph = _build(model_node, tools_node, saver)
        decided_at: dict[str, float] = {}

        async def one(n: int) -> bool:
            config = {"configurable": {"thread_id": f"async-{n}"}}
            first = {"messages": [{"role": "user", "content": setup.PROMPT}]}
            out = await graph.ainvoke(first, config, durability=args.durability)
            if "__interrupt__" not in out:
                return False
            decided_at[f"async-{n}:call_1"] = time.perf_counter()
            out = await graph.ainvoke(Command(resume="approved"), config, durability=args.durability)
            return out["messages"][-1].get("content") == FINAL

        t0 = time.perf_counter()
        done = await asyncio.gather(*(one(n) for n in range(args.runs)))
        seconds = time.perf_counter() - t0
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT count(*) AS n FROM lg_side_effect WHERE idempotency_key LIKE 'async-%%'")
            effects = (await cur.fetchone())["n"]
    await client.close()
    lags = [measure.ms(effect_at[k] - decided_at[k]) for k in effect_at if k in decided_at]
    return {
        "runs": args.runs,
        "completed": sum(done),
        "effects": int(effects),
        "seconds": seconds,
        "max_in_flight": model.max_in_flight,
        "model_requests": len(model.server.requests),
        "decision_to_effect": measure.summary(lags),
    }


# -- agentfast through its real processes ------------------------------------------------------


def _agentfast_throughput(args: argparse.Namespace, model: SlowModel) -> dict[str, Any]:
    """`agentfast serve` + `agentfast worker` × --workers (as `make run` starts them), driven over the API."""
    from agents import services
    from agents.models import Approval, Run, SideEffect
    from bench import measure

    services.user_create(username="bench-client", role="reviewer")
    token = services.token_create(username="bench-client")[1]
    env = _process_env(args)
    workers = []
    for n in range(1, args.workers + 1):
        log = setup.VAR_DIR / f"compare-worker{n}.log"
        log.unlink(missing_ok=True)
        worker_env = dict(env)
        if args.scale_out:  # a machine of its own: its own var/ folder, the shared Postgres and Redis
            worker_env["AGENTFAST_VAR_DIR"] = str(setup.VAR_DIR / f"machine{n}")
            worker_env["AGENTFAST_LOG_LEVEL"] = "INFO"  # each drive logs its run: the split is counted from the logs
        extra = () if args.concurrency is None else _pool_args(args.concurrency)
        workers.append(setup.start_cli_worker(log, name=f"bench{n}", extra=extra, **worker_env))
    daphne = setup.start_cli_serve(setup.VAR_DIR / "compare-daphne.log", **env)
    pids = {"web": daphne.process.pid, **{f"worker{n}": w.process.pid for n, w in enumerate(workers, 1)}}
    database = urlsplit(os.environ["DATABASE_URL"])
    cpu = ProcessMeter(pids, (database.port or 5432) if database.scheme.startswith("postgres") else None)
    approver = Approver(daphne.url, {"Authorization": f"Bearer {token}"}, threads=args.approvers)
    try:
        approver.start()
        cpu.start()
        with httpx_client(daphne.url, token, connections=8) as client:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(8) as pool:
                run_ids = set(pool.map(lambda _: _start_run(client), range(args.runs)))
            started = time.perf_counter() - t0
            deadline = time.monotonic() + 60 + args.runs * args.delay * 4
            # Until every run has ended: completed, or failed when the model kept failing.
            while Run.objects.filter(pk__in=run_ids, status__in=ENDED).count() < args.runs:
                if time.monotonic() > deadline:
                    raise setup.BenchError("agentfast's runs did not all complete; see var/bench/compare-*.log")
                if approver.errors:
                    raise setup.BenchError(f"the approver failed: {approver.errors[0]}")
                approver.catch_up(client)
                time.sleep(0.25)
            seconds = time.perf_counter() - t0
        cpu_seconds = cpu.stop()
    finally:
        approver.stop()
        daphne.stop()
        setup.stop_workers()
    decided_at = approver.decided_at
    effects = SideEffect.objects.filter(idempotency_key__in=list(decided_at))
    lags = [measure.ms(e.created_at.timestamp() - decided_at[e.idempotency_key]) for e in effects]
    approved = Approval.objects.filter(run_id__in=run_ids, status=Approval.Status.APPROVED).count()
    # The part after the web process wrote the decision: the queue, a worker thread, the lease, the call.
    decided_rows = dict(Approval.objects.filter(run_id__in=run_ids).values_list("id", "decided_at"))
    created_rows = dict(Approval.objects.filter(run_id__in=run_ids).values_list("id", "created_at"))
    heard = [
        measure.ms(at - created_rows[key].timestamp()) for key, at in approver.heard_at.items() if key in created_rows
    ]
    after_row = [
        measure.ms((e.created_at - decided_rows[e.idempotency_key]).total_seconds())
        for e in effects
        if decided_rows.get(e.idempotency_key)
    ]
    # Its first part: until a worker claimed the call (the commit, the queue, a worker thread, the lease).
    claims = Approval.objects.filter(run_id__in=run_ids, decided_at__isnull=False, tool_call__executed_at__isnull=False)
    to_claim = [
        measure.ms((claimed - decided).total_seconds())
        for decided, claimed in claims.values_list("decided_at", "tool_call__executed_at")
    ]
    return {
        "runs": args.runs,
        "completed": Run.objects.filter(pk__in=run_ids, status=Run.Status.COMPLETED).count(),
        "failed": Run.objects.filter(pk__in=run_ids, status=Run.Status.FAILED).count(),
        "model_failures": model.failed,
        "approved": approved,
        "effects": effects.count(),
        "distinct_effects": effects.values("idempotency_key").distinct().count(),
        "seconds": seconds,
        "start_seconds": started,
        "max_in_flight": model.max_in_flight,
        "model_requests": len(model.server.requests),
        "decision_to_effect": measure.summary(lags),
        "row_to_effect": measure.summary(after_row),
        "row_to_claim": measure.summary(to_claim),
        "paused_to_heard": measure.summary(heard),
        "decide_request": measure.summary(
            [measure.ms(approver.answered_at[k] - decided_at[k]) for k in approver.answered_at]
        ),
        "from_stream": approver.from_stream,
        "from_listing": approver.from_listing,
        "cpu_seconds": cpu_seconds,
        "db_connections": cpu.max_connections if cpu.db_port else None,
        "split": _split(workers, run_ids) if args.scale_out else None,
    }


ENDED = ("completed", "failed", "cancelled")


def _pool_args(concurrency: int) -> tuple[str, ...]:
    return ("--pool=solo",) if concurrency == 1 else (f"--concurrency={concurrency}",)


def _process_env(args: argparse.Namespace) -> dict[str, str]:
    """What every agentfast process of the pass gets beyond the bench's own environment."""
    env: dict[str, str] = {}
    if args.scale_out:
        # Separate var/ folders: the Redis and the secret key must be named, as on two machines.
        from django.conf import settings

        env["REDIS_URL"] = settings.REDIS_URL
        env["DJANGO_SECRET_KEY"] = settings.SECRET_KEY
    return env


def httpx_client(base_url: str, token: str, *, connections: int) -> Any:
    import httpx

    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=60, limits=limits)


def _start_run(client: Any) -> str:
    response = client.post("/api/runs", json={"agent": "slow", "input": setup.PROMPT})
    if response.status_code != 201:
        raise setup.BenchError(f"POST /api/runs: {response.status_code} {response.text}")
    return response.json()["id"]


class Approver:
    """A reviewer's client: follows `GET /api/events` and approves each `approval_required` at once.

    Decisions go out on `threads` threads (several reviewers, or one busy integration); the
    stream is what tells them, the way a bot or a dashboard hears of a new card. A listing of
    the pending approvals every few seconds catches anything the stream did not deliver.
    """

    def __init__(self, base_url: str, headers: dict[str, str], *, threads: int) -> None:
        import httpx

        self.base_url, self.headers = base_url, headers
        limits = httpx.Limits(max_connections=threads + 2, max_keepalive_connections=threads + 2)
        self.client = httpx.Client(base_url=base_url, headers=headers, timeout=60, limits=limits)
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="approver")
        self.lock = threading.Lock()
        self.submitted: set[str] = set()
        self.decided_at: dict[str, float] = {}  # approval id (= the side effect's key) → when its POST left
        self.answered_at: dict[str, float] = {}  # … → when its 200 came back
        self.heard_at: dict[str, float] = {}  # … → when its approval_required came on the stream
        self.errors: list[str] = []
        self.from_stream = self.from_listing = 0
        self.live = threading.Event()
        self.stopping = threading.Event()
        self.last_listing = time.monotonic()

    def start(self) -> None:
        threading.Thread(target=self._follow, name="approver-stream", daemon=True).start()
        if not self.live.wait(30):
            raise setup.BenchError(f"GET /api/events did not go live: {self.errors}")

    def stop(self) -> None:
        self.stopping.set()
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.client.close()

    def _follow(self) -> None:
        import httpx

        last_id: str | None = None
        timeout = httpx.Timeout(60, read=None)
        with httpx.Client(base_url=self.base_url, headers=self.headers, timeout=timeout) as client:
            while not self.stopping.is_set():
                headers = {"Last-Event-ID": last_id} if last_id else {}
                try:
                    with client.stream("GET", "/api/events", headers=headers) as response:
                        if response.status_code != 200:
                            self.errors.append(f"GET /api/events: {response.status_code} {response.read()!r}")
                            return
                        for line in response.iter_lines():
                            if self.stopping.is_set():
                                return
                            if line == ": live":
                                self.live.set()
                            elif line.startswith("id: "):
                                last_id = line[4:]
                            elif line.startswith("data: "):
                                payload = json.loads(line[6:])
                                if payload.get("event") == "approval_required":
                                    self.heard_at.setdefault(payload["data"]["approval_id"], time.time())
                                    self._submit(payload["data"]["approval_id"], stream=True)
                except httpx.HTTPError:
                    if not self.stopping.is_set():
                        time.sleep(0.1)  # reconnect, from the last id seen

    def catch_up(self, client: Any, every: float = 3.0) -> None:
        """Now and then, approve pending approvals the stream has not brought (none, normally)."""
        if time.monotonic() - self.last_listing < every:
            return
        self.last_listing = time.monotonic()
        page = client.get("/api/approvals", params={"status": "pending", "agent": "slow", "limit": 200})
        for item in page.json()["items"]:
            self._submit(item["id"], stream=False)

    def _submit(self, approval_id: str, *, stream: bool) -> None:
        with self.lock:
            if approval_id in self.submitted or self.stopping.is_set():
                return
            self.submitted.add(approval_id)
            if stream:
                self.from_stream += 1
            else:
                self.from_listing += 1
        self.pool.submit(self._decide, approval_id)

    def _decide(self, approval_id: str) -> None:
        self.decided_at[approval_id] = time.time()
        try:
            response = self.client.post(f"/api/approvals/{approval_id}/decide", json={"decision": "approved"})
        except Exception as exc:  # noqa: BLE001 — reported by the main loop
            self.errors.append(f"decide {approval_id}: {exc!r}")
            return
        self.answered_at[approval_id] = time.time()
        if response.status_code != 200:
            self.errors.append(f"decide {approval_id}: {response.status_code} {response.text}")


class ProcessMeter:
    """CPU seconds each agentfast process spent during the pass, and the most Postgres connections it held."""

    def __init__(self, pids: dict[str, int], db_port: int | None) -> None:
        import psutil

        self.processes = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.db_port = db_port
        self.before: dict[str, float] = {}
        self.max_connections = dict.fromkeys(pids, 0)
        self.stopping = threading.Event()
        self.sampler = threading.Thread(target=self._sample, name="meter", daemon=True)

    def _now(self) -> dict[str, float]:
        out = {}
        for name, process in self.processes.items():
            times = process.cpu_times()
            out[name] = times.user + times.system
        out["bench"] = sum(os.times()[:2])
        return out

    def _sample(self) -> None:
        while self.db_port and not self.stopping.wait(0.5):
            for name, process in self.processes.items():
                try:
                    held = [c for c in process.net_connections("tcp") if c.raddr and c.raddr.port == self.db_port]
                except Exception:  # noqa: BLE001 — the process is gone
                    continue
                self.max_connections[name] = max(self.max_connections[name], len(held))

    def start(self) -> None:
        self.before = self._now()
        self.sampler.start()

    def stop(self) -> dict[str, float]:
        after = self._now()
        self.stopping.set()
        return {name: after[name] - self.before[name] for name in after}


def _split(workers: list[Any], run_ids: set[str]) -> dict[str, Any]:
    """Count, from each worker's log, the drives it made of each run; a run driven by two at once would show."""
    import re

    pattern = re.compile(r"agents\.tasks: drove (run_\w+): (\w+)")  # our handler's lines, not the root copy
    per_worker: dict[str, int] = {}
    per_run: dict[str, list[str]] = {}
    for n, worker in enumerate(workers, 1):
        drives = [m.groups() for m in pattern.finditer(worker.log_path.read_text(errors="replace"))]
        per_worker[f"worker{n}"] = len([d for d in drives if d[0] in run_ids])
        for run_id, status in drives:
            if run_id in run_ids:
                per_run.setdefault(run_id, []).append(f"worker{n}:{status}")
    # A run is driven once to its pause and once, after the decision, to its end: a status twice is a double drive.
    doubled = sum(1 for drives in per_run.values() if _repeats([d.split(":")[1] for d in drives]))
    return {
        "drives": per_worker,
        "runs_seen": len(per_run),
        "doubled": doubled,
        "both_workers": sum(1 for d in per_run.values() if len({x.split(":")[0] for x in d}) > 1),
    }


def _repeats(statuses: list[str]) -> bool:
    return len(statuses) != len(set(statuses))


# -- the report ---------------------------------------------------------------------------------


def _ratio(a: dict[str, float], b: dict[str, float]) -> float:
    return a["growth_bytes"] / b["growth_bytes"] if b["growth_bytes"] else float("nan")


def render(results: dict[str, Any]) -> str:
    meta = results["meta"]
    durability = meta["args"]["durability"]
    out = [
        f"agentfast vs LangGraph (PostgresSaver, durability={durability}) · agentfast on {meta['database']}",
        f"{meta['cpus']} CPUs, load average {meta['loadavg_1m']:.2f}; bench time {meta['seconds']:.1f} s",
    ]
    if "round_trip" in results:
        out += _render_in_process(results)
    if "af_throughput" in results:
        out += _render_throughput(results)
    out += [
        "",
        "targets (issue 12, information): round trip ≤ 0.5× LangGraph's; bytes per paused run ≤ 0.5×;",
        "  runs/s ≥ LangGraph's at 1,000 runs (--runs 1000), decision → side effect p95 ≤ 100 ms",
    ]
    return "\n".join(out)


def _render_in_process(results: dict[str, Any]) -> list[str]:
    rt, st = results["round_trip"], results["storage"]
    af, lg = rt["agentfast"], rt["langgraph"]
    out = [
        "",
        f"{'ROUND TRIP in process (start → paused → approve → done)':<58}{'n':>6}{'p50 ms':>10}{'p95 ms':>10}",
        f"{'  agentfast (services + runtime.drive, demo model)':<58}{af['n']:>6}{af['p50_ms']:>10.2f}{af['p95_ms']:>10.2f}",
        f"{'  LangGraph (interrupt / Command(resume), scripted model)':<58}{lg['n']:>6}{lg['p50_ms']:>10.2f}{lg['p95_ms']:>10.2f}",
        f"{'  ratio agentfast / LangGraph':<64}{af['p50_ms'] / lg['p50_ms']:>10.2f}×{af['p95_ms'] / lg['p95_ms']:>9.2f}×",
    ]
    if "round_trip_cpu" in results:
        afc, lgc = results["round_trip_cpu"]["agentfast"], results["round_trip_cpu"]["langgraph"]
        out += [
            f"{'  CPU of this process per round trip, agentfast':<58}{afc['n']:>6}{afc['p50_ms']:>10.2f}{afc['p95_ms']:>10.2f}",
            f"{'  CPU of this process per round trip, LangGraph':<58}{lgc['n']:>6}{lgc['p50_ms']:>10.2f}{lgc['p95_ms']:>10.2f}",
            f"{'  ratio agentfast / LangGraph (CPU)':<64}{afc['p50_ms'] / lgc['p50_ms']:>10.2f}×"
            f"{afc['p95_ms'] / lgc['p95_ms']:>9.2f}×",
        ]
    if "round_trip_writes" in results:
        aw, lw = results["round_trip_writes"]["agentfast"], results["round_trip_writes"]["langgraph"]
        out += [
            "",
            f"{'WRITTEN PER ROUND TRIP (PostgreSQL, mean)':<58}{'WAL B':>10}{'write tx':>10}",
            f"{'  agentfast':<58}{aw['wal_bytes']:>10.0f}{aw['write_transactions']:>10.2f}",
            f"{'  LangGraph':<58}{lw['wal_bytes']:>10.0f}{lw['write_transactions']:>10.2f}",
            f"{'  ratio agentfast / LangGraph':<58}{aw['wal_bytes'] / lw['wal_bytes']:>9.2f}×"
            f"{aw['write_transactions'] / lw['write_transactions']:>9.2f}×",
        ]
    out += [
        "",
        f"{'BYTES PER PAUSED RUN':<58}{'rows':>10}{'growth':>10}",
    ]
    a, b = st["agentfast"], st["langgraph"]
    return out + [
        f"{'  agentfast (agents_* rows; table+index growth)':<58}{a['row_bytes']:>10.0f}{a['growth_bytes']:>10.0f}",
        f"{'  LangGraph (checkpoint rows; table+index growth)':<58}{b['row_bytes']:>10.0f}{b['growth_bytes']:>10.0f}",
        f"{'  ratio agentfast / LangGraph':<58}{a['row_bytes'] / b['row_bytes']:>9.2f}×{_ratio(a, b):>9.2f}×",
    ]


def _runs_per_second(t: dict[str, Any]) -> float:
    return float(t["runs"] / t["seconds"])


def _render_throughput(results: dict[str, Any]) -> list[str]:
    args = results["meta"]["args"]
    out = [
        "",
        f"THROUGHPUT  {args['runs']} runs each, model answering every turn after {args['delay']} s (2 turns a run)",
        f"{'':<46}{'runs/s':>8}{'done':>7}{'effects':>9}{'in flight':>11}{'dec→effect p50/p95 ms':>23}",
    ]
    rows = [(f"  LangGraph async (pool {args['pool']}, in process)", "lg_throughput")]
    rows.append((f"  agentfast (serve + {args['workers']} workers, HTTP API)", "af_throughput"))
    for label, key in rows:
        if key not in results:
            continue
        t = results[key]
        lag = t["decision_to_effect"]
        out.append(
            f"{label:<46}{_runs_per_second(t):>8.2f}{t['completed']:>7}{t['effects']:>9}"
            f"{t['max_in_flight']:>11}{lag['p50_ms']:>12.1f} /{lag['p95_ms']:>8.1f}"
        )
    t = results["af_throughput"]
    if "lg_throughput" in results:
        ratio = _runs_per_second(t) / _runs_per_second(results["lg_throughput"])
        out.append(f"  runs/s ratio agentfast / LangGraph: {ratio:.2f}×")
    threads = "the default" if args["concurrency"] is None else args["concurrency"]
    out.append(
        f"  agentfast: {threads} threads a worker, {args['approvers']} approver threads (decisions heard on the "
        f"stream {t['from_stream']}, from a listing {t['from_listing']}); runs started in {t['start_seconds']:.1f} s"
    )
    out.append(
        f"  model requests failed on purpose {t['model_failures']} of {t['model_requests']}; runs failed "
        f"{t['failed']}, lost {t['runs'] - t['completed'] - t['failed']}; approvals {t['approved']}, "
        f"side effects {t['effects']} ({t['effects'] - t['distinct_effects']} doubled)"
    )
    out.append(
        f"  POST …/decide answered in p50 {t['decide_request']['p50_ms']:.1f} / p95 "
        f"{t['decide_request']['p95_ms']:.1f} ms; decision row written → effect p50 "
        f"{t['row_to_effect']['p50_ms']:.1f} / p95 {t['row_to_effect']['p95_ms']:.1f} ms (queue, worker, lease, call), "
        f"of which until the call was claimed p50 {t['row_to_claim']['p50_ms']:.1f} / p95 "
        f"{t['row_to_claim']['p95_ms']:.1f} ms"
    )
    out.append(
        f"  paused (approval row) → approval_required heard on GET /api/events: p50 "
        f"{t['paused_to_heard']['p50_ms']:.1f} / p95 {t['paused_to_heard']['p95_ms']:.1f} ms"
    )
    cpu = ", ".join(f"{name} {seconds:.1f}" for name, seconds in t["cpu_seconds"].items())
    out.append(f"  CPU seconds during the pass: {cpu} ({t['seconds']:.1f} s of wall time)")
    if t.get("db_connections"):
        held = ", ".join(f"{name} {count}" for name, count in t["db_connections"].items())
        out.append(f"  Postgres connections held at most: {held}")
    split = t.get("split")
    if split:
        shares = ", ".join(f"{name} {count}" for name, count in split["drives"].items())
        out.append(
            f"  scale-out: drives per worker {shares}; runs seen {split['runs_seen']}, driven by both workers "
            f"(pause on one, resume on the other) {split['both_workers']}, driven twice {split['doubled']}"
        )
    return out


if __name__ == "__main__":
    raise SystemExit(main())
