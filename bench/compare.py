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
import signal
import sys
import threading
import time
from collections.abc import Iterator
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
        "--concurrency", type=int, default=50, help="threads per agentfast worker (default 50; 1: the solo pool)"
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
    args = parser.parse_args(argv)
    if min(args.rounds, args.paused, args.runs, args.workers, args.pool, args.concurrency) < 1:
        parser.error("--rounds, --paused, --runs, --workers, --concurrency and --pool must be at least 1")
    if not 0 <= args.fail_rate < 1:
        parser.error("--fail-rate must be in [0, 1)")
    return args


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwind through the finally blocks: stop the processes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    os.environ.setdefault("DATABASE_URL", DEFAULT_URL)
    if urlsplit(os.environ["DATABASE_URL"]).scheme not in {"postgres", "postgresql"}:
        print("bench: the comparison needs PostgreSQL (DATABASE_URL=postgres://…/<name with 'bench'>)", file=sys.stderr)
        return 1
    try:
        import langgraph.checkpoint.postgres  # noqa: F401
    except ImportError:
        print("bench: LangGraph is missing: pip install -e '.[bench]'", file=sys.stderr)
        return 1
    redis = model = None
    try:
        target = setup.prepare()
        model = SlowModel(args.delay).start()
        (setup.VAR_DIR / "bench.yaml").write_text(_config(model.base_url))
        redis = setup.start_redis()
        with _django(target):
            print(render(_run(args, target, model)))
    except setup.BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    finally:
        setup.stop_workers()
        setup.stop_redis(redis)
        if model is not None:
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


@contextmanager
def _django(target: setup.Target) -> Iterator[None]:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    progress(f"migrating a fresh {target.engine} database ({target.label})")
    call_command("migrate", verbosity=0, interactive=False)
    try:
        yield
    finally:
        connections.close_all()


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


def _run(args: argparse.Namespace, target: setup.Target, model: SlowModel) -> dict[str, Any]:
    from bench import measure

    started = time.perf_counter()
    url = os.environ["DATABASE_URL"]
    conninfo = _conninfo(url)
    measure.check_flow()
    results: dict[str, Any] = {}
    with LangGraphSync(conninfo, args.durability) as lg:
        lg.check_flow()
        progress(f"round trip in process: {args.rounds} rounds of each, alternating (+10 warm-up)")
        af_rt, lg_rt = [], []
        for index in range(10 + args.rounds):
            af = _agentfast_round_trip()
            lgt = lg.round_trip(f"rt-{index}")
            if index >= 10:
                af_rt.append(af)
                lg_rt.append(lgt)
        results["round_trip"] = {"agentfast": measure.summary(af_rt), "langgraph": measure.summary(lg_rt)}
        progress(f"bytes per paused run: {args.paused} paused runs of each")
        results["storage"] = {"agentfast": _agentfast_storage(args.paused), "langgraph": lg.storage(args.paused)}
    if not args.no_throughput:
        progress(f"throughput, LangGraph async: {args.runs} runs at once, model answering after {args.delay} s")
        model.reset()
        results["lg_throughput"] = asyncio.run(_langgraph_async(conninfo, args, model))
        progress(
            f"throughput, agentfast: daphne + {args.workers} workers × {args.concurrency} threads, "
            f"{args.runs} runs over the HTTP API, {args.fail_rate:.0%} of model requests failing"
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


def _conninfo(url: str) -> str:
    parts = urlsplit(url)
    user = unquote(parts.username or "postgres")
    password = f":{unquote(parts.password)}" if parts.password else ""
    host = parts.hostname or "127.0.0.1"
    return f"postgresql://{user}{password}@{host}:{parts.port or 5432}/{unquote(parts.path.lstrip('/'))}"


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
    import httpx

    from agents import services
    from agents.models import Approval, Run, SideEffect
    from bench import measure

    services.user_create(username="bench-client", role="reviewer")
    token = services.token_create(username="bench-client")[1]
    for n in range(args.workers):
        setup.start_worker(setup.VAR_DIR / f"compare-worker{n + 1}.log", concurrency=args.concurrency)
    daphne = setup.start_daphne(setup.VAR_DIR / "compare-daphne.log")
    headers = {"Authorization": f"Bearer {token}"}
    decided_at: dict[str, float] = {}
    try:
        with httpx.Client(base_url=daphne.url, headers=headers, timeout=60) as client:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(8) as pool:
                created = list(pool.map(lambda _: _start_run(client), range(args.runs)))
            run_ids = set(created)
            deadline = time.monotonic() + 60 + args.runs * args.delay * 4
            # Until every run has ended: completed, or failed when the model kept failing.
            while Run.objects.filter(pk__in=run_ids, status__in=ENDED).count() < args.runs:
                if time.monotonic() > deadline:
                    raise setup.BenchError("agentfast's runs did not all complete; see var/bench/compare-*.log")
                page = client.get("/api/approvals", params={"status": "pending", "agent": "slow", "limit": 200})
                for item in page.json()["items"]:
                    if item["id"] in decided_at:
                        continue
                    decided_at[item["id"]] = time.time()
                    response = client.post(f"/api/approvals/{item['id']}/decide", json={"decision": "approved"})
                    if response.status_code != 200:
                        raise setup.BenchError(f"decide {item['id']}: {response.status_code} {response.text}")
                time.sleep(0.01)
            seconds = time.perf_counter() - t0
    finally:
        daphne.stop()
        setup.stop_workers()
    effects = SideEffect.objects.filter(idempotency_key__in=list(decided_at))
    lags = [measure.ms(e.created_at.timestamp() - decided_at[e.idempotency_key]) for e in effects]
    approved = Approval.objects.filter(run_id__in=run_ids, status=Approval.Status.APPROVED).count()
    return {
        "runs": args.runs,
        "completed": Run.objects.filter(pk__in=run_ids, status=Run.Status.COMPLETED).count(),
        "failed": Run.objects.filter(pk__in=run_ids, status=Run.Status.FAILED).count(),
        "model_failures": model.failed,
        "approved": approved,
        "effects": effects.count(),
        "distinct_effects": effects.values("idempotency_key").distinct().count(),
        "seconds": seconds,
        "max_in_flight": model.max_in_flight,
        "model_requests": len(model.server.requests),
        "decision_to_effect": measure.summary(lags),
    }


ENDED = ("completed", "failed", "cancelled")


def _start_run(client: Any) -> str:
    response = client.post("/api/runs", json={"agent": "slow", "input": setup.PROMPT})
    if response.status_code != 201:
        raise setup.BenchError(f"POST /api/runs: {response.status_code} {response.text}")
    return response.json()["id"]


# -- the report ---------------------------------------------------------------------------------


def _ratio(a: dict[str, float], b: dict[str, float]) -> float:
    return a["growth_bytes"] / b["growth_bytes"] if b["growth_bytes"] else float("nan")


def render(results: dict[str, Any]) -> str:
    meta, rt, st = results["meta"], results["round_trip"], results["storage"]
    af, lg = rt["agentfast"], rt["langgraph"]
    out = [
        f"agentfast vs LangGraph (PostgresSaver, durability={meta['args']['durability']}) · {meta['database']}",
        f"{meta['cpus']} CPUs, load average {meta['loadavg_1m']:.2f}; bench time {meta['seconds']:.1f} s",
        "",
        f"{'ROUND TRIP in process (start → paused → approve → done)':<58}{'n':>6}{'p50 ms':>10}{'p95 ms':>10}",
        f"{'  agentfast (services + runtime.drive, demo model)':<58}{af['n']:>6}{af['p50_ms']:>10.2f}{af['p95_ms']:>10.2f}",
        f"{'  LangGraph (interrupt / Command(resume), scripted model)':<58}{lg['n']:>6}{lg['p50_ms']:>10.2f}{lg['p95_ms']:>10.2f}",
        f"{'  ratio agentfast / LangGraph':<64}{af['p50_ms'] / lg['p50_ms']:>10.2f}×{af['p95_ms'] / lg['p95_ms']:>9.2f}×",
        "",
        f"{'BYTES PER PAUSED RUN':<58}{'rows':>10}{'growth':>10}",
    ]
    a, b = st["agentfast"], st["langgraph"]
    out += [
        f"{'  agentfast (agents_* rows; table+index growth)':<58}{a['row_bytes']:>10.0f}{a['growth_bytes']:>10.0f}",
        f"{'  LangGraph (checkpoint rows; table+index growth)':<58}{b['row_bytes']:>10.0f}{b['growth_bytes']:>10.0f}",
        f"{'  ratio agentfast / LangGraph':<58}{a['row_bytes'] / b['row_bytes']:>9.2f}×{_ratio(a, b):>9.2f}×",
    ]
    if "af_throughput" in results:
        args = meta["args"]
        out += [
            "",
            f"THROUGHPUT  {args['runs']} runs each, model answering every turn after {args['delay']} s (2 turns a run)",
            f"{'':<44}{'runs/s':>9}{'done':>7}{'effects':>9}{'in flight':>11}{'dec→effect p95 ms':>19}",
        ]
        for label, key in (
            (f"  LangGraph async (pool {args['pool']}, in process)", "lg_throughput"),
            (f"  agentfast (daphne + {args['workers']} workers, HTTP API)", "af_throughput"),
        ):
            t = results[key]
            out.append(
                f"{label:<44}{t['runs'] / t['seconds']:>9.2f}{t['completed']:>7}{t['effects']:>9}"
                f"{t['max_in_flight']:>11}{t['decision_to_effect']['p95_ms']:>19.2f}"
            )
        ratio = (results["af_throughput"]["runs"] / results["af_throughput"]["seconds"]) / (
            results["lg_throughput"]["runs"] / results["lg_throughput"]["seconds"]
        )
        out.append(f"  runs/s ratio agentfast / LangGraph: {ratio:.2f}×")
        t = results["af_throughput"]
        out.append(
            f"  agentfast: {args['concurrency']} threads a worker; model requests failed on purpose "
            f"{t['model_failures']} of {t['model_requests']}; runs failed {t['failed']}, "
            f"lost {t['runs'] - t['completed'] - t['failed']}; approvals {t['approved']}, "
            f"side effects {t['effects']} ({t['effects'] - t['distinct_effects']} doubled)"
        )
    out += [
        "",
        "targets (issue 12, information): round trip ≤ 0.5× LangGraph's; bytes per paused run ≤ 0.5×;",
        "  runs/s ≥ LangGraph's at 1,000 runs (--runs 1000), decision → side effect p95 ≤ 100 ms",
    ]
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
