"""Grading code in the sandbox: a harness runs the model's function on each case's arguments
and reports the return values as JSON; the comparison with the expected values happens here.

Expected outputs never enter the sandbox, so code that returns an object whose __eq__ is
always True, or prints fake results, gains nothing; a report the code forged or broke counts
as a crash.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from offline_agent.sandbox import run_python

PER_TEST_S = 0.5  # alarm per test call, so one endless case does not zero the others
MARKER = "@@oa-results@@"
REPORT_FIELD_CHARS = 500  # the harness cuts every field of its report to this
_INVALID = object()  # what _loads returns for text that is not (safe) JSON

# Runs in the sandbox after `PAYLOAD = '<json>'`: executes the code, calls the function on
# each argument list, prints one marker line with the JSON-encoded return values.
HARNESS = r"""
import contextlib, io, json, linecache, signal, sys
P = json.loads(PAYLOAD)
def _alarm(*_):
    raise TimeoutError("took longer than %ss" % P["per_test_s"])
def _error(e):
    return ["error", (type(e).__name__ + ": " + str(e))[:200]]
def _value(v):
    try:
        text = json.dumps(v, sort_keys=True)
    except (TypeError, ValueError):
        return ["error", "returned a %s, not a plain value" % type(v).__name__]
    return ["ok", text] if len(text) <= 500 else ["error", "return value too large"]
res = {"error": None, "results": []}
out = io.StringIO()
linecache.cache["solution.py"] = (len(P["code"]), None, P["code"].splitlines(True), "solution.py")
signal.signal(signal.SIGALRM, _alarm)
with contextlib.redirect_stdout(out):
    ns = {"__name__": "solution"}
    signal.setitimer(signal.ITIMER_REAL, 2 * P["per_test_s"])
    try:
        exec(compile(P["code"], "solution.py", "exec"), ns)
    except SyntaxError as e:
        res["error"] = ("SyntaxError: %s (line %s)" % (e.msg, e.lineno))[:200]
    except BaseException as e:
        res["error"] = _error(e)[1]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    fn = ns.get(P["name"])
    if res["error"] is None and not callable(fn):
        res["error"] = "NameError: function %r is not defined" % P["name"]
    if res["error"] is None:
        for args in P["cases"]:
            signal.setitimer(signal.ITIMER_REAL, P["per_test_s"])
            try:
                res["results"].append(_value(fn(*args)))
            except BaseException as e:
                res["results"].append(_error(e))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
res["stdout"] = out.getvalue()[:500]
sys.__stdout__.write("\n" + MARKER + json.dumps(res) + "\n")
"""


@dataclass
class Report:
    """Outcome of running code on test cases."""

    passed: list[bool]
    lines: list[str]  # one PASS/FAIL line per case
    error: str | None  # code-level failure (syntax, missing function, timeout, crash)
    stdout: str


def run_cases(code: str, name: str, cases: list[list], allow_weaker: bool = False) -> Report:
    """Run `code` in the sandbox and compare `name(*args)` with each case's expected value."""
    payload = {
        "code": code,
        "name": name,
        "cases": [args for args, _ in cases],
        "per_test_s": PER_TEST_S,
    }
    script = f"PAYLOAD = {json.dumps(payload)!r}\nMARKER = {MARKER!r}\n{HARNESS}"
    timeout_s = 2 + PER_TEST_S * (len(cases) + 2)  # start-up, module code, every case
    result = run_python(script, timeout_s=timeout_s, allow_weaker=allow_weaker)
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith(MARKER)]
    res = _parse_results(lines[-1][len(MARKER) :], len(cases)) if lines else None
    if res is None:
        if result.timed_out:
            why = f"timed out after {timeout_s:g}s"
        else:
            why = (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]
        return Report([False] * len(cases), [], f"the program crashed: {why}"[:300], "")
    if res["error"]:
        return Report([False] * len(cases), [], res["error"], res["stdout"])
    passed, report_lines = [], []
    for (args, expected), (kind, text) in zip(cases, res["results"]):
        call = _short(f"{name}({', '.join(map(repr, args))})")
        ok = kind == "ok" and json.loads(text) == expected
        passed.append(ok)
        if ok:
            report_lines.append(f"PASS {call}")
        elif kind == "ok":
            report_lines.append(
                f"FAIL {call}: expected {_short(repr(expected))}, got {_short(repr(json.loads(text)))}"
            )
        else:
            report_lines.append(f"ERROR {call}: {text}")
    return Report(passed, report_lines, None, res["stdout"])


def _parse_results(line: str, n_cases: int) -> dict | None:
    """The harness's report, or None if it is malformed (the code may have forged or broken it)."""
    res = _loads(line)
    if res is _INVALID:
        return None
    if not (
        isinstance(res, dict)
        and (res.get("error") is None or _short_text(res["error"]))
        and _short_text(res.get("stdout"))
        and isinstance(res.get("results"), list)
        and (res["error"] is not None or len(res["results"]) == n_cases)
        and all(_valid_result(r) for r in res["results"])
    ):
        return None
    return res


def _valid_result(r: object) -> bool:
    if not (isinstance(r, list) and len(r) == 2 and r[0] in ("ok", "error") and _short_text(r[1])):
        return False
    return r[0] == "error" or _loads(r[1]) is not _INVALID


def _short_text(value: object) -> bool:
    """A string no longer than the harness ever writes (it cuts every field to 500)."""
    return isinstance(value, str) and len(value) <= REPORT_FIELD_CHARS


def _loads(text: str) -> Any:
    """JSON from the sandbox's report line, or _INVALID where the code broke or forged it
    (not JSON, nested too deeply, an integer of more than 4,300 digits)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _INVALID


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
