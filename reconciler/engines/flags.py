"""Which option a command-line token sets, decided the way the engine's own parser decides it.

A profile's args must not set a flag the reconciler sets for each rank (the engine
would take whichever came last, and the plan would lie). Comparing spellings is
not enough: vLLM's parser is argparse with abbreviations on (`--nnode` is
`--nnodes`, `--master-ad` is `--master-addr`), short aliases (`-n`, `-r`) and
underscores read as dashes; SGLang's is plain argparse (abbreviations, but
`--tp_size` is an error); llama.cpp's takes exact names only, with underscores
read as dashes in `--` options.

So each engine has an option table dumped from its real parser
(scripts/dump-engine-parsers.py; tests/data/engine_parsers/ holds the full
dumps, reconciler/engines/parsers/ the part needed here) and a resolver that
follows that parser's rules.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Sequence

from reconciler.frozen import frozen

TABLES = Path(__file__).resolve().parent / "parsers"


@frozen
class Resolved:
    """What one token sets: `option` is the action's first long spelling (its canonical name)."""

    option: str | None  # None: not an option of this parser (unknown, or ambiguous)
    spelling: str  # the option string the parser matched (or the token's name part)
    ambiguous: tuple[str, ...] = ()  # an abbreviation matching several options
    value: str | None = None  # a value attached to the token (`--port=1`, `-n4`)


class OptionTable:
    """The option strings of one parser and the rules it reads a token by."""

    def __init__(
        self,
        options: Iterable[Sequence[str]],
        *,
        allow_abbrev: bool,
        underscores_as_dashes: bool,
        exact_only: bool = False,
        equals_value: bool = True,
    ):
        self.by_string: dict[str, str] = {}
        for strings in options:
            canonical = next((s for s in strings if s.startswith("--")), strings[0])
            for s in strings:
                self.by_string[s] = canonical
        self.allow_abbrev = allow_abbrev
        self.underscores_as_dashes = underscores_as_dashes
        self.exact_only = exact_only  # llama.cpp: no abbreviations, no `-n4`
        self.equals_value = equals_value  # llama.cpp has no `--flag=value`

    def canonical(self, option: str) -> str | None:
        return self.by_string.get(option)

    def _normalise(self, token: str) -> str:
        if self.underscores_as_dashes and token.startswith("--"):
            return token.replace("_", "-")
        return token

    def resolve(self, token: str) -> Resolved | None:
        """None for a token that is not an option at all (a value, a positional, `--`)."""
        if len(token) < 2 or not token.startswith("-") or token == "--" or _is_negative_number(token):
            return None
        token = self._normalise(token)
        if token in self.by_string:
            return Resolved(self.by_string[token], token)
        if self.exact_only:
            return self._resolve_exact(token)
        # argparse (_parse_optional / _get_option_tuples), the same on Python 3.10-3.13
        # for what a profile can write.
        name, sep, value = token.partition("=")
        if sep and name in self.by_string:
            return Resolved(self.by_string[name], name, value=value)
        if token.startswith("--"):
            matches = self._long_matches(name, value if sep else None)
        else:
            matches = self._short_matches(token)
        if len(matches) == 1:
            (canonical, (spelling, attached_value)), = matches.items()
            return Resolved(canonical, spelling, value=attached_value)
        if len(matches) > 1:
            return Resolved(None, name, ambiguous=tuple(sorted(s for s, _ in matches.values())))
        return Resolved(None, name)

    def _resolve_exact(self, token: str) -> Resolved:
        """A parser of exact names only (llama.cpp): `--x=v` where it reads `=value`, else no option."""
        name, sep, value = token.partition("=") if self.equals_value else (token, "", "")
        if sep and name in self.by_string:
            return Resolved(self.by_string[name], name, value=value)
        return Resolved(None, name)

    def _long_matches(self, name: str, value: str | None) -> dict[str, tuple[str, str | None]]:
        """Canonical name -> (spelling, value) of each option a `--name` abbreviates, where abbreviations are allowed."""
        matches: dict[str, tuple[str, str | None]] = {}
        if self.allow_abbrev:
            for s, canonical in self.by_string.items():
                if s.startswith(name):
                    matches.setdefault(canonical, (s, value))
        return matches

    def _short_matches(self, token: str) -> dict[str, tuple[str, str | None]]:
        """`-n4` is `-n 4`; `-as` may abbreviate a single-dash long option like `-asc`."""
        matches: dict[str, tuple[str, str | None]] = {}
        short, attached = token[:2], token[2:]
        for s, canonical in self.by_string.items():
            if s == short:
                matches.setdefault(canonical, (s, attached))
            elif self.allow_abbrev and s.startswith(token) and not s.startswith("--"):
                matches.setdefault(canonical, (s, None))
        return matches


def _is_negative_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


@lru_cache(maxsize=None)
def table_for(engine: str) -> OptionTable | None:
    """The option table of an engine's parser; None for an engine without one (command)."""
    if engine == "llama.cpp":
        return _llama_table()
    path = TABLES / f"{engine}.json"
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    return OptionTable(
        (tuple(o) for o in doc["options"]),
        allow_abbrev=doc["allow_abbrev"],
        underscores_as_dashes=doc["underscores_as_dashes"],
    )


# llama-server options the reconciler reasons about (aliases as in common/arg.cpp).
LLAMA_SERVER_OPTIONS = (
    ("-m", "--model"),
    ("-mu", "--model-url"),
    ("-hf", "-hfr", "--hf-repo"),
    ("-dr", "--docker-repo"),
    ("--host",),
    ("--port",),
    ("--rpc",),
    ("-ngl", "--gpu-layers", "--n-gpu-layers"),
    ("-t", "--threads"),
    ("-a", "--alias"),
    ("--metrics",),
)


def _llama_table() -> OptionTable:
    # llama.cpp's common/arg.cpp: exact names, `--x_y` read as `--x-y`, no `=value`. Only the
    # options the reconciler reasons about are listed; any other token resolves to None (no clash).
    return OptionTable(LLAMA_SERVER_OPTIONS, allow_abbrev=False, underscores_as_dashes=True,
                       exact_only=True, equals_value=False)


@frozen
class FlagUse:
    index: int  # position in the args list
    token: str
    option: str  # canonical name of what it sets
    value: str | None  # the value it sets, when the args hold one


def option_uses(engine: str, args: Sequence[str], takes_value: frozenset[str] = frozenset()) -> list[FlagUse]:
    """Every token of `args` that sets an option of the engine's parser, with its value where
    the option takes one from `takes_value` (attached, or the next token)."""
    table = table_for(engine)
    if table is None:
        return []
    uses = []
    for i, token in enumerate(args):
        if token == "--":
            break
        r = table.resolve(token)
        if r is None or r.option is None:
            continue
        value = r.value
        if value is None and r.option in takes_value and i + 1 < len(args):
            value = args[i + 1]
        uses.append(FlagUse(i, token, r.option, value))
    return uses


def owned_uses(engine: str, args: Sequence[str], owned: frozenset[str]) -> list[FlagUse]:
    """The tokens of a profile's args that set a flag the reconciler owns (canonical names)."""
    return [u for u in option_uses(engine, args) if u.option in owned]


def sets_option(engine: str, args: Sequence[str], options: frozenset[str]) -> bool:
    return any(u.option in options for u in option_uses(engine, args))


def describe(use: FlagUse) -> str:
    """`--nnode (read by the engine as --nnodes)` or just `--nnodes`."""
    spelled = use.token.split("=", 1)[0]
    return use.option if spelled == use.option else f"{spelled} (read by the engine as {use.option})"
