"""The real vLLM 0.33.0 / SGLang 0.5.23 parsers, rebuilt from their dumped option tables.

tests/data/engine_parsers/<engine>.json is what scripts/dump-engine-parsers.py read off the
engine's own parser (option strings, aliases, nargs, choices, allow_abbrev). `real_parser`
turns it back into an argparse parser with the same strings, arities, choices and
abbreviation rule, so an argv is judged by argparse itself, as the engine would judge it:
abbreviations, short aliases with attached values (`-n4`), `--x=y`, ambiguity.
"""

from __future__ import annotations

import argparse
import json
import re
from functools import lru_cache
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "data" / "engine_parsers"


class ParseFailure(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # the engine would exit 2 with this message
        raise ParseFailure(message)

    def exit(self, status=0, message=None):
        raise ParseFailure(message or f"exit {status}")


@lru_cache(maxsize=None)
def fixture(engine: str) -> dict:
    return json.loads((FIXTURES / f"{engine}.json").read_text())


def _nargs(value):
    return value if value in (None, "?", "*", "+") or isinstance(value, int) else None


def real_parser(engine: str) -> argparse.ArgumentParser:
    doc = fixture(engine)
    p = _Parser(prog=" ".join(doc["command"]), allow_abbrev=doc["allow_abbrev"], add_help=False)
    for opt in doc["options"]:
        strings = opt["option_strings"]
        if opt["nargs"] == 0:
            p.add_argument(*strings, dest=opt["dest"], action="store_true")
            continue
        kw = {"dest": opt["dest"], "nargs": _nargs(opt["nargs"])}
        if opt["choices"] is not None and all(isinstance(c, str) for c in opt["choices"]):
            kw["choices"] = opt["choices"]
        p.add_argument(*strings, **kw)
    for pos in doc["positionals"]:
        p.add_argument(pos["dest"], nargs=_nargs(pos["nargs"]))
    return p


_UNDERSCORES = re.compile(r"(?<=--)[^\.]*")


def preprocess(engine: str, args: list[str]) -> list[str]:
    """What the engine's CLI does to argv before argparse sees it (vLLM: `--a_b` -> `--a-b`)."""
    if not fixture(engine)["underscores_as_dashes"]:
        return list(args)
    out = []
    for a in args:
        if a.startswith("--"):
            key, sep, value = a.partition("=")
            out.append(_UNDERSCORES.sub(lambda m: m.group(0).replace("_", "-"), key, count=1) + sep + value)
        else:
            out.append(a)
    return out


def parse(engine: str, argv: list[str] | tuple[str, ...]) -> argparse.Namespace:
    """Parse a full command line (`vllm serve ...`, `sglang serve ...`) as the engine would; ParseFailure if it would refuse it."""
    command = fixture(engine)["command"]
    if list(argv[: len(command)]) != command:
        raise ParseFailure(f"not a {' '.join(command)} command line: {argv[:len(command)]}")
    return real_parser(engine).parse_args(preprocess(engine, list(argv[len(command):])))


def dest_of(engine: str, option: str) -> str:
    for opt in fixture(engine)["options"]:
        if option in opt["option_strings"]:
            return opt["dest"]
    raise KeyError(option)
