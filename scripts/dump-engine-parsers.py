#!/usr/bin/env python3
"""Dump the real command-line parsers of vLLM and SGLang to test fixtures.

Run where vLLM 0.33.0 and/or SGLang 0.5.23 import (they need no GPU to build
their parsers; see tests/data/engine_parsers/README.md for how the committed
fixtures were made). For each engine found it builds the parser exactly as
the engine's own CLI does (`vllm serve`: the `serve` subparser of vLLM's
FlexibleArgumentParser; `sglang serve`: ServerArgs.add_cli_args on the parser
prepare_server_args uses), and writes:

  tests/data/engine_parsers/<engine>.json   every option: strings, dest, nargs,
                                            choices, whether it takes a value,
                                            plus the parser's rules
                                            (allow_abbrev, underscores)
  reconciler/engines/parsers/<engine>.json  the part the reconciler reads at run
                                            time (option strings and the rules)

    python3 scripts/dump-engine-parsers.py [vllm] [sglang]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "data" / "engine_parsers"
RUNTIME = REPO / "reconciler" / "engines" / "parsers"
EXPECTED = {"vllm": "0.33.0", "sglang": "0.5.23"}


def vllm_parser() -> tuple[argparse.ArgumentParser, str, dict]:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    import vllm
    import vllm.entrypoints.cli.serve as serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # As vllm.entrypoints.cli.main.main builds it: a top-level parser, one subparser per command.
    top = FlexibleArgumentParser(prog="vllm")
    sub = top.add_subparsers(dest="subparser", required=False)
    (cmd,) = serve.cmd_init()
    parser = cmd.subparser_init(sub)
    rules = {
        # FlexibleArgumentParser.parse_args rewrites `--a_b` (the part before `=`) to `--a-b`.
        "underscores_as_dashes": True,
        "command": ["vllm", "serve"],
    }
    return parser, vllm.__version__, rules


def sglang_parser() -> tuple[argparse.ArgumentParser, str, dict]:
    import sglang
    from sglang.srt.server_args import ServerArgs

    # As sglang.srt.server_args.prepare_server_args builds it (what `sglang serve` calls).
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    rules = {"underscores_as_dashes": False, "command": ["sglang", "serve"]}
    return parser, sglang.__version__, rules


def _jsonable(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    return repr(value)


def option_table(parser: argparse.ArgumentParser) -> tuple[list[dict], list[dict]]:
    # The strings the parser matches are those in its lookup table, which may hold more than an
    # action's option_strings shows (vLLM's EnableDisableAction hides `--no-enable-x` from help
    # but still accepts it): visible strings first, then the hidden ones.
    registered: dict[int, list[str]] = {}
    for string, action in parser._option_string_actions.items():
        registered.setdefault(id(action), []).append(string)
    options, positionals = [], []
    for action in parser._actions:
        visible = list(action.option_strings)
        hidden = sorted(s for s in registered.get(id(action), []) if s not in visible)
        entry = {
            "option_strings": visible + hidden,
            "dest": action.dest,
            "nargs": action.nargs if not isinstance(action.nargs, int) else action.nargs,
            "takes_value": action.nargs != 0,
            "choices": None if action.choices is None else sorted(_jsonable(list(action.choices)), key=str),
            "action": type(action).__name__,
        }
        (options if action.option_strings else positionals).append(entry)
    options.sort(key=lambda e: e["option_strings"])
    return options, positionals


def dump(engine: str) -> bool:
    build = {"vllm": vllm_parser, "sglang": sglang_parser}[engine]
    try:
        parser, version, rules = build()
    except ImportError as exc:
        print(f"{engine}: not importable here ({exc}); skipped", file=sys.stderr)
        return False
    if version != EXPECTED[engine]:
        print(f"{engine}: found {version}, the fixtures are for {EXPECTED[engine]}; skipped", file=sys.stderr)
        return False
    options, positionals = option_table(parser)
    header = {
        "engine": engine,
        "version": version,
        "python": "%d.%d.%d" % sys.version_info[:3],
        "made_by": "scripts/dump-engine-parsers.py, from the installed package's own parser",
        "command": rules["command"],
        "allow_abbrev": parser.allow_abbrev,
        "prefix_chars": parser.prefix_chars,
        "underscores_as_dashes": rules["underscores_as_dashes"],
    }
    FIXTURES.mkdir(parents=True, exist_ok=True)
    RUNTIME.mkdir(parents=True, exist_ok=True)
    full = dict(header, options=options, positionals=positionals)
    (FIXTURES / f"{engine}.json").write_text(json.dumps(full, indent=1, sort_keys=False) + "\n")
    runtime = {k: header[k] for k in ("engine", "version", "allow_abbrev", "underscores_as_dashes")}
    runtime["options"] = [o["option_strings"] for o in options]
    (RUNTIME / f"{engine}.json").write_text(json.dumps(runtime, indent=0) + "\n")
    print(f"{engine} {version}: {len(options)} options, {len(positionals)} positionals")
    return True


def main(argv: list[str]) -> int:
    engines = argv or list(EXPECTED)
    done = [e for e in engines if dump(e)]
    return 0 if done else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
