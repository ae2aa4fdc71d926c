"""A canary's checks, measured (SPEC section 13): the effect at the edge of reconciler/decide/canary.py.

request     the request the model's `rollout.checks.request` describes, sent to each canary copy and
            to the stable ones: every canary answer must have the status and the text expected
            (measurement `request`), and the canary's p95 latency over the stable copies' must stay
            within max_latency_ratio (measurement `latency`).
prometheus  each query through Prometheus's HTTP API (GET /api/v1/query), $MODEL, $CANARY and $STABLE
            substituted; its one number must stay within max and min.

Whatever goes wrong (a copy that does not answer in time, a Prometheus that cannot be reached, a PromQL
error, an answer that is not JSON) is a failed measurement that says why in words, never an exception:
the caller tallies it against failure_limit. The network comes in through two seams (`post`, `get`),
so the judgement is tested without sockets and the real checks run against real servers.
"""

from __future__ import annotations

import http.client
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from time import monotonic
from typing import Callable, Sequence

from reconciler.decide.canary import LATENCY, REQUEST, Measurement
from reconciler.frozen import frozen
from reconciler.model import Model, PrometheusCheck, RequestCheck
from reconciler.act.readiness import why_no_answer
from reconciler.errors import parse_json

REQUESTS_PER_COPY = 2  # per copy per measurement: "1 of 2 failed" says more than a single yes or no
STABLE_COPIES_ASKED = 3  # the baseline for the latency ratio: a few stable copies are enough


@frozen
class Target:
    """A copy the request check asks: its replica id and where its engine listens (host bare)."""

    replica: str
    host: str
    port: int


@frozen
class Answer:
    """What a copy answered: the HTTP status and body, and how long it took; `failed` when there was none."""

    status: int = 0
    body: bytes = b""
    seconds: float = 0.0
    failed: str = ""  # why there is no answer, in words


PostFn = Callable[[Target, str, bytes, float], Answer]
GetFn = Callable[[str, float], "tuple[int, bytes] | str"]  # (status, body), or why there is no answer


def post_json(target: Target, path: str, body: bytes, timeout: float) -> Answer:
    """POST the body to the copy's engine; an answer, or why there was none."""
    conn = http.client.HTTPConnection(target.host, target.port, timeout=timeout)
    began = monotonic()
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", "Connection": "close"})
        resp = conn.getresponse()
        data = resp.read(1 << 20)
        return Answer(resp.status, data, monotonic() - began)
    except (OSError, http.client.HTTPException, UnicodeError) as exc:
        return Answer(failed=why_no_answer(exc, timeout), seconds=monotonic() - began)
    finally:
        conn.close()


def get_url(url: str, timeout: float) -> "tuple[int, bytes] | str":
    """GET a URL (http or https): (status, body), an error status's body included, or why no answer came."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (a URL the catalog checked)
            return resp.status, resp.read(1 << 22)
    except urllib.error.HTTPError as exc:  # Prometheus answers a PromQL error with 400 and a JSON body
        with exc:
            return exc.code, exc.read(1 << 20)
    except urllib.error.URLError as exc:
        reason = exc.reason
        return why_no_answer(reason, timeout) if isinstance(reason, BaseException) else str(reason)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return why_no_answer(exc, timeout)


def measure(model: Model, canaries: Sequence[Target], stable: Sequence[Target], *,
            post: PostFn = post_json, get: GetFn = get_url) -> list[Measurement]:
    """One measurement of each of the model's checks (canary.check_names), from the copies as they are now."""
    policy = model.rollout
    if policy is None:
        return []
    out: list[Measurement] = []
    if policy.request is not None:
        out += request_measurements(policy.request, canaries, stable, post)
    if policy.prometheus is not None:
        out += prometheus_measurements(policy.prometheus, model, canaries, stable, get)
    return out


# -- the request check


def request_measurements(check: RequestCheck, canaries: Sequence[Target], stable: Sequence[Target],
                         post: PostFn) -> list[Measurement]:
    body = check.body_json.encode()
    asked = [*canaries, *stable[:STABLE_COPIES_ASKED]]

    def ask(target: Target) -> list[Answer]:
        return [post(target, check.path, body, check.timeout_s) for _ in range(REQUESTS_PER_COPY)]

    with ThreadPoolExecutor(max_workers=max(1, len(asked))) as pool:
        answers = dict(zip([t.replica + ("/canary" if i < len(canaries) else "") for i, t in enumerate(asked)],
                           pool.map(ask, asked)))
    canary_answers = [a for t in canaries for a in answers[t.replica + "/canary"]]
    stable_answers = [a for t in stable[:STABLE_COPIES_ASKED] for a in answers[t.replica]]
    wrong = [w for w in (judge(check, a) for a in canary_answers) if w]
    n = len(canary_answers)
    if wrong:
        said = f"{REQUEST}: {len(wrong)} of {n} failed: {_most_common(wrong)}"
    else:
        said = f"{REQUEST}: {n} of {n} answered as expected"
    out = [Measurement(REQUEST, not wrong, said)]
    if check.max_latency_ratio is not None:
        latency = latency_measurement(check.max_latency_ratio,
                                      [a.seconds for a in canary_answers if not judge(check, a)],
                                      [a.seconds for a in stable_answers if not judge(check, a)])
        if latency is not None:
            out.append(latency)
    return out


def judge(check: RequestCheck, answer: Answer) -> str:
    """What is wrong with one answer, in words; "" when it is as expected."""
    if answer.failed:
        return answer.failed
    if answer.status != check.status:
        return f"HTTP {answer.status}"
    if check.contains is None and check.matches is None:
        return ""
    text = generated_text(answer.body)
    if check.contains is not None and check.contains not in text:
        return f"answer {_short(text)} lacks {check.contains!r}"
    if check.matches is not None and re.search(check.matches, text) is None:
        return f"answer {_short(text)} does not match {check.matches!r}"
    return ""


def generated_text(body: bytes) -> str:
    """The text a model generated: an OpenAI chat or completion answer's first choice, else the body."""
    try:
        doc = parse_json(body)
        choice = doc["choices"][0]
        text = (choice.get("message") or {}).get("content")
        return str(text if text is not None else choice.get("text", ""))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return body.decode("utf-8", "replace")


def latency_measurement(max_ratio: float, canary: list[float], stable: list[float]) -> Measurement | None:
    """Canary p95 over stable p95; None when either side has no good answer to time (the request
    measurement already says why)."""
    if not canary or not stable:
        return None
    c, s = p95(canary), p95(stable)
    ratio = c / s if s > 0 else math.inf
    said = f"{LATENCY}: p95 {c:.2g} s = {ratio:.2g}x stable {s:.2g} s"
    return Measurement(LATENCY, ratio <= max_ratio, said + ("" if ratio <= max_ratio else f" (max {max_ratio:g}x)"))


def p95(values: list[float]) -> float:
    """The nearest-rank 95th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def _most_common(said: list[str]) -> str:
    return max(dict.fromkeys(said), key=said.count)


def _short(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


# -- the prometheus check


def replica_regex(targets: Sequence[Target]) -> str:
    """Replica ids as a PromQL label regex: `.` the only character of an id that a regex reads
    otherwise, written as a class so that no backslash has to survive a PromQL string."""
    ids = sorted({t.replica for t in targets})
    return "|".join(i.replace(".", "[.]") for i in ids) or "^$"


def substitute(query: str, model: Model, canaries: Sequence[Target], stable: Sequence[Target]) -> str:
    values = {"MODEL": model.name, "CANARY": replica_regex(canaries), "STABLE": replica_regex(stable)}
    return re.sub(r"\$(MODEL|CANARY|STABLE)\b", lambda m: values[m.group(1)], query)


def prometheus_measurements(check: PrometheusCheck, model: Model, canaries: Sequence[Target],
                            stable: Sequence[Target], get: GetFn) -> list[Measurement]:
    def one(q) -> Measurement:
        promql = substitute(q.query, model, canaries, stable)
        url = f"{check.address}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        answer = get(url, check.timeout_s)
        value = query_value(answer, check.address)
        if isinstance(value, str):
            return Measurement(q.name, False, f"{q.name}: {value}")
        if math.isnan(value):
            return Measurement(q.name, False, f"{q.name}: the query's value is NaN")
        if q.max is not None and value > q.max:
            return Measurement(q.name, False, f"{q.name}: {value:g} is above max {q.max:g}")
        if q.min is not None and value < q.min:
            return Measurement(q.name, False, f"{q.name}: {value:g} is below min {q.min:g}")
        bounds = " and ".join(x for x in (f"max {q.max:g}" if q.max is not None else "",
                                          f"min {q.min:g}" if q.min is not None else "") if x)
        return Measurement(q.name, True, f"{q.name}: {value:g} within {bounds}")

    with ThreadPoolExecutor(max_workers=max(1, len(check.queries))) as pool:
        return list(pool.map(one, check.queries))


def query_value(answer: "tuple[int, bytes] | str", address: str) -> "float | str":
    """The one number a query answered, or why there is none, in words."""
    if isinstance(answer, str):
        return f"Prometheus at {address} did not answer: {answer}"
    status, body = answer
    try:
        doc = parse_json(body)
    except ValueError:
        return f"Prometheus at {address} answered HTTP {status} with no JSON (is it a Prometheus?)"
    if not isinstance(doc, dict):
        return f"Prometheus at {address} answered HTTP {status} with JSON that is not a query result"
    if doc.get("status") != "success":
        return f"PromQL error ({doc.get('errorType', f'HTTP {status}')}): {doc.get('error', 'no reason given')}"
    data = doc.get("data") or {}
    kind, result = data.get("resultType"), data.get("result")
    try:
        if kind == "scalar":
            return float(result[1])
        if kind == "vector":
            if len(result) != 1:
                return (f"the query returned {len(result)} series; it must return one number "
                        "(aggregate it, e.g. with sum(...))") if result else "the query returned no samples"
            return float(result[0]["value"][1])
    except (TypeError, KeyError, IndexError, ValueError):
        pass
    return f"the query returned a {kind or 'malformed'} result; it must return one number"
