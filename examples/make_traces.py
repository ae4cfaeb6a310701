"""Produce examples/traces/: a few hundred agent traces in OTLP JSON Lines (gzip), by real
instrumentation.

A small tool-using agent loop calls the real ``openai`` SDK, instrumented by the official
``opentelemetry-instrumentation-openai-v2`` (message content capture on), against the fake LLM
server from ``tests/fakellm``. The agent itself creates an ``invoke_agent`` root span and one
``execute_tool`` span per tool call with the OTel API, following the GenAI semantic
conventions. Spans go through the SDK's ``BatchSpanProcessor`` into an exporter that writes
what the OTel Collector's file exporter writes (one ``ExportTraceServiceRequest`` per line), and
rotates files every so many traces, so some traces are split across two files.

The fake server cannot ask for tool calls, so the agent's HTTP client turns a scripted
``{"tool_calls": [...]}`` answer into a real OpenAI tool-call response before the SDK (and the
instrumentation) sees it. Questions, tool results and answers vary; some answers are poor
(rambling, off-topic, ignoring a tool error), so the example scorers give different scores.

    .venv/bin/python examples/make_traces.py            # writes examples/traces/*.jsonl.gz
    .venv/bin/python examples/make_traces.py --traces 50 --out /tmp/traces
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import random
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

# The instrumentation reads these when it is set up: content capture on, current conventions.
os.environ.setdefault("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
os.environ.setdefault("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")

import httpx
import openai
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.fakellm import FakeLLMServer, Reply
from tracing.otlp import spans_to_otlp_json

MODEL = "gpt-4o-mini"


# --- the exporter: the Collector file exporter's format, rotating, gzip -------------------------


class OtlpJsonLinesExporter(SpanExporter):
    """One OTLP/JSON ``ExportTraceServiceRequest`` per export call, one line each."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.index = -1
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        self.rotate()

    def rotate(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
            self.index += 1
            path = self.directory / f"traces-{self.index:03d}.jsonl.gz"
            # mtime=0: the same input gives the same bytes.
            self._file = io.TextIOWrapper(gzip.GzipFile(path, "wb", mtime=0), encoding="utf-8")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        line = json.dumps(spans_to_otlp_json(spans), ensure_ascii=False, separators=(",", ":"))
        with self._lock:
            assert self._file is not None
            self._file.write(line + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


# --- a fake LLM that can call tools ---------------------------------------------------------


class ToolCallingTransport(httpx.BaseTransport):
    """Forwards to the fake server; a ``{"tool_calls": [...]}`` answer becomes OpenAI tool calls."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.calls = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if not request.url.path.endswith("/chat/completions") or response.status_code != 200:
            return response
        body = json.loads(response.read())
        message = body["choices"][0]["message"]
        try:
            planned = json.loads(message.get("content") or "")
        except ValueError:
            planned = None
        if isinstance(planned, dict) and "tool_calls" in planned:
            calls = []
            for call in planned["tool_calls"]:
                self.calls += 1
                calls.append(
                    {
                        "id": f"call_{self.calls:05d}",
                        "type": "function",
                        "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
                    }
                )
            body["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": calls}
            body["choices"][0]["finish_reason"] = "tool_calls"
        headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-encoding")}
        return httpx.Response(response.status_code, headers=headers, json=body)


# --- the tools (deterministic fake data) -----------------------------------------------------

CITIES = {
    "Paris": (18, "cloudy"),
    "Berlin": (11, "light rain"),
    "Tokyo": (24, "sunny"),
    "Lisbon": (22, "clear"),
    "Oslo": (3, "snow"),
    "Cairo": (31, "hot and dry"),
    "Toronto": (9, "windy"),
    "Lima": (19, "overcast"),
}
PRODUCTS = {
    "running shoes": [("Trail Runner 2", 89.0), ("Road Flyer", 120.0)],
    "headphones": [("QuietOne ANC", 199.0), ("BassBuds", 49.0)],
    "backpack": [("Daypack 20L", 59.0)],
    "desk lamp": [("Lumo LED", 35.0), ("ArmLight", 42.0)],
}
RATES = {("USD", "EUR"): 0.92, ("EUR", "USD"): 1.09, ("GBP", "EUR"): 1.17, ("USD", "JPY"): 151.2}


def get_weather(city: str) -> dict[str, Any]:
    if city not in CITIES:
        return {"error": f"unknown city {city!r}"}
    temp, sky = CITIES[city]
    return {"city": city, "temp_c": temp, "sky": sky}


def search_products(query: str) -> dict[str, Any]:
    found = PRODUCTS.get(query)
    if not found:
        return {"error": "search backend timed out"}
    return {"results": [{"name": n, "price_usd": p} for n, p in found]}


def get_order_status(order_id: str) -> dict[str, Any]:
    if order_id.endswith("0"):
        return {"error": f"order {order_id} not found"}
    status = ["shipped", "processing", "delivered"][int(order_id[-1]) % 3]
    return {"order_id": order_id, "status": status, "eta_days": int(order_id[-1]) % 5 + 1}


def convert_currency(amount: float, source: str, target: str) -> dict[str, Any]:
    rate = RATES.get((source, target))
    if rate is None:
        return {"error": f"no rate for {source}->{target}"}
    return {"amount": round(amount * rate, 2), "currency": target, "rate": rate}


TOOLS: dict[str, tuple[Callable[..., dict[str, Any]], str, dict[str, Any]]] = {
    "get_weather": (
        get_weather,
        "Current weather for a city.",
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    ),
    "search_products": (
        search_products,
        "Search the shop's catalogue.",
        {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    ),
    "get_order_status": (
        get_order_status,
        "Where an order is.",
        {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
    ),
    "convert_currency": (
        convert_currency,
        "Convert an amount between currencies.",
        {
            "type": "object",
            "properties": {"amount": {"type": "number"}, "source": {"type": "string"}, "target": {"type": "string"}},
            "required": ["amount", "source", "target"],
        },
    ),
}


# --- scenarios: a question, the tool call the model makes, and how good its answer is --------


def _scenario(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["weather", "weather", "shop", "order", "currency", "chitchat"])
    if kind == "weather":
        city = rng.choice([*CITIES, "Atlantis"])
        question = rng.choice(
            [
                f"What's the weather in {city} right now?",
                f"Do I need a jacket in {city} today?",
                f"How warm is it in {city}?",
            ]
        )
        return {
            "agent": "weather-agent",
            "question": question,
            "tool": ("get_weather", {"city": city}),
            "system": "You are a weather assistant. Always use the get_weather tool. Be concise.",
        }
    if kind == "shop":
        query = rng.choice([*PRODUCTS, "garden gnome"])
        question = rng.choice([f"Can you recommend some {query}?", f"What {query} do you sell and how much are they?"])
        return {
            "agent": "shop-assistant",
            "question": question,
            "tool": ("search_products", {"query": query}),
            "system": "You help customers of an online shop. Use search_products for catalogue questions.",
        }
    if kind == "order":
        order = f"A{rng.randint(1000, 9999)}"
        question = rng.choice([f"Where is my order {order}?", f"When will order {order} arrive?"])
        return {
            "agent": "shop-assistant",
            "question": question,
            "tool": ("get_order_status", {"order_id": order}),
            "system": "You help customers of an online shop. Use get_order_status for order questions.",
        }
    if kind == "currency":
        amount = rng.choice([20, 75, 120, 300])
        pair = rng.choice([*RATES, ("CHF", "USD")])
        question = f"How much is {amount} {pair[0]} in {pair[1]}?"
        return {
            "agent": "travel-helper",
            "question": question,
            "tool": ("convert_currency", {"amount": amount, "source": pair[0], "target": pair[1]}),
            "system": "You are a travel helper. Use convert_currency for money questions.",
        }
    topic = rng.choice(["a good book for a long flight", "how to pack light", "jet lag tips"])
    return {
        "agent": "travel-helper",
        "question": f"Any advice on {topic}?",
        "tool": None,
        "system": "You are a travel helper. Answer briefly and kindly.",
    }


def _answer(scenario: dict[str, Any], result: dict[str, Any] | None, quality: str) -> str:
    question = scenario["question"]
    if quality == "off_topic":
        return "Thanks for reaching out! Our support team is available around the clock on weekdays."
    if quality == "rambling":
        filler = (
            " It is worth remembering that many different factors can play a role here, and that "
            "circumstances can change quickly, so it is always a good idea to double-check, to plan ahead, "
            "and to keep an eye on any updates that might come in later during the day or the week."
        )
        return f"Regarding your question ({question.rstrip('?')}): " + filler * 3
    if result is None:
        return {
            "a good book for a long flight": "Try a gripping novel such as 'The Martian' for a long flight.",
            "how to pack light": "To pack light, plan outfits, roll clothes and limit shoes to two pairs.",
            "jet lag tips": "For jet lag, shift your sleep a day early, drink water and get morning light.",
        }.get(question.removeprefix("Any advice on ").rstrip("?"), "Here is my advice: keep it simple.")
    if "error" in result:
        if quality == "ignores_error":
            return "Everything looks fine, no problems at all with your request."
        return f"Sorry, I could not get that: {result['error']}. Please try again later."
    if "temp_c" in result:
        return f"It is {result['temp_c']}°C and {result['sky']} in {result['city']} right now."
    if "results" in result:
        items = ", ".join(f"{r['name']} (${r['price_usd']:.0f})" for r in result["results"])
        return f"We have these: {items}."
    if "status" in result:
        return f"Your order {result['order_id']} is {result['status']}; expected in {result['eta_days']} days."
    return f"That is {result['amount']} {result['currency']} at a rate of {result['rate']}."


def run_agent(tracer: Tracer, client: openai.OpenAI, server: FakeLLMServer, rng: random.Random, number: int) -> None:
    scenario = _scenario(rng)
    quality = rng.choices(["good", "off_topic", "rambling", "ignores_error"], weights=[70, 10, 10, 10])[0]
    conversation = f"conv-{number // 3:04d}"
    tools = [
        {"type": "function", "function": {"name": name, "description": desc, "parameters": params}}
        for name, (_, desc, params) in TOOLS.items()
    ]
    messages: list[dict[str, Any]] = [{"role": "system", "content": scenario["system"]}]
    if number % 4 == 0:  # a follow-up turn: the model sees the earlier exchange
        messages += [
            {"role": "user", "content": "Hi, I have a quick question."},
            {"role": "assistant", "content": "Of course, how can I help?"},
        ]
    messages.append({"role": "user", "content": scenario["question"]})
    attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": scenario["agent"],
        "gen_ai.agent.id": f"{scenario['agent']}-v1",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": MODEL,
        "gen_ai.conversation.id": conversation,
    }
    with tracer.start_as_current_span(
        f"invoke_agent {scenario['agent']}", kind=SpanKind.INTERNAL, attributes=attributes
    ) as agent_span:
        result: dict[str, Any] | None = None
        if scenario["tool"] is not None:
            name, arguments = scenario["tool"]
            server.script(Reply.json({"tool_calls": [{"name": name, "arguments": arguments}]}))
            first = client.chat.completions.create(model=MODEL, messages=messages, tools=tools)  # type: ignore[arg-type]
            call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.function.name, "arguments": call.function.arguments},
                        }
                    ],
                }
            )  # type: ignore[union-attr]
            function, description, _ = TOOLS[name]
            with tracer.start_as_current_span(
                f"execute_tool {name}",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": name,
                    "gen_ai.tool.type": "function",
                    "gen_ai.tool.description": description,
                    "gen_ai.tool.call.id": call.id,
                    "gen_ai.tool.call.arguments": json.dumps(arguments),
                },
            ) as tool_span:
                result = function(**arguments)
                tool_span.set_attribute("gen_ai.tool.call.result", json.dumps(result))
                if "error" in result:
                    tool_span.set_status(Status(StatusCode.ERROR, result["error"]))
                    tool_span.set_attribute("error.type", "ToolError")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
        server.script(Reply.text(_answer(scenario, result, quality)))
        final = client.chat.completions.create(model=MODEL, messages=messages, tools=tools)  # type: ignore[arg-type]
        agent_span.set_attribute("gen_ai.response.model", final.model)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=int, default=300)
    parser.add_argument("--per-file", type=int, default=120, help="rotate the output file after this many traces")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "traces")
    args = parser.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("traces-*.jsonl.gz"):
        old.unlink()
    exporter = OtlpJsonLinesExporter(args.out)
    provider = TracerProvider(
        resource=Resource.create({"service.name": "support-bot", "deployment.environment.name": "demo"})
    )
    # Small export batches: a trace's spans land on several lines, as with a real collector.
    provider.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=16, schedule_delay_millis=50))
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    rng = random.Random(args.seed)
    with FakeLLMServer() as server:
        transport = ToolCallingTransport()
        client = openai.OpenAI(
            base_url=server.openai_base_url,
            api_key="sk-fakellm-example",
            max_retries=0,
            http_client=httpx.Client(transport=transport),
        )
        tracer = provider.get_tracer("examples.support_bot", "1.0.0")
        for number in range(args.traces):
            if number and number % args.per_file == 0:
                exporter.rotate()  # spans still in the processor's queue land in the next file
            run_agent(tracer, client, server, rng, number)
    OpenAIInstrumentor().uninstrument()
    provider.shutdown()
    files = sorted(args.out.glob("traces-*.jsonl.gz"))
    size = sum(f.stat().st_size for f in files)
    print(f"wrote {args.traces} traces to {len(files)} files in {args.out} ({size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
