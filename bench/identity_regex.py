"""Identity regexes on certificate fields (issue 41 item 7): Python's backtracking ``re`` against
the RE2 matcher that ``kernelbake.signing.policy.IdentityRule`` uses, on patterns that backtrack
exponentially (``^(a+)+$``) or not at all, with fields of ``a`` * n + ``!`` (no match: the worst
case for backtracking). ``re`` runs up to 28 characters and stops at the first length past
``--re-limit`` seconds; RE2 also runs on 1,000 and 100,000.

Prints JSON and writes bench/results/identity_regex.json.

    .venv/bin/python bench/identity_regex.py [--re-limit 2]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "identity_regex.json"

from kernelbake import __version__  # noqa: E402
from kernelbake.signing.policy import IdentityRule  # noqa: E402

PATTERNS = (r"^(a+)+$", r"^(a|aa)+$", r"^https://github\.com/acme/.+@refs/heads/main$")


def _seconds(match: Any, field: str) -> float:
    started = time.perf_counter()
    match(field)
    return time.perf_counter() - started


def _rule_matches(rule: IdentityRule, subject: str) -> bool:
    return rule.matches("https://i", [subject])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--re-limit", type=float, default=2.0, help="stop re past this many seconds")
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    for pattern in PATTERNS:
        rule = IdentityRule(issuer="https://i", subject_regex=pattern)
        compiled = re.compile(pattern)
        re_stopped = False
        for n in (16, 20, 22, 24, 25, 26, 28, 1_000, 100_000):
            field = "a" * n + "!"
            row: dict[str, Any] = {"pattern": pattern, "field_chars": len(field)}
            row["re2_s"] = round(_seconds(functools.partial(_rule_matches, rule), field), 6)
            # Past 28 characters only RE2: a backtracking match of 1,000 would not end.
            if not re_stopped and n <= 28:
                row["re_s"] = round(_seconds(compiled.fullmatch, field), 6)
                re_stopped = row["re_s"] > args.re_limit
            results.append(row)
            print(json.dumps(row), file=sys.stderr)
    doc = {
        "bench": "identity_regex",
        "kernelbake": __version__,
        "machine": {"cpus": len(os.sched_getaffinity(0)), "python": platform.python_version()},
        "re_limit_s": args.re_limit,
        "results": results,
    }
    text = json.dumps(doc, indent=2)
    print(text)
    RESULTS.write_text(text + "\n")
    return 0 if all(r["re2_s"] < 1 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
