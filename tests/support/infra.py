"""Readers for the deployment files, for tests that cannot build or run them here.

There is no Docker engine, cluster or nginx on the test machines, so the tests read the
files the way those tools would: Dockerfile instructions with line continuations, compose
variable interpolation, the nginx configuration's block structure, dotenv files.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from app.lib.settings import SETTING_VARIABLES

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
K8S = INFRA / "k8s"
DOCKERFILE = INFRA / "docker" / "Dockerfile"
DOCKERIGNORE = INFRA / "docker" / "Dockerfile.dockerignore"
HEALTHCHECK_SCRIPT = INFRA / "docker" / "healthcheck.py"
COMPOSE = INFRA / "compose.yaml"
ENV_EXAMPLE = INFRA / ".env.example"
NGINX_CONF = INFRA / "nginx" / "arona.conf"
DEPLOYMENT_DOC = ROOT / "docs" / "deployment.md"

PLACEHOLDER = "REPLACE_ME"
SECRET_SETTINGS = frozenset(
    {
        "ARONA_DATABASE_URL",
        "ARONA_REDIS_URL",
        "ARONA_JWT_SECRET",
        "ARONA_VAULT_KEYS",
        "ARONA_ADMIN_TOKEN",
    }
)


def known_settings() -> frozenset[str]:
    """Every ARONA_* variable the settings loader reads."""
    return SETTING_VARIABLES


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


# ---- Dockerfile ----


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [i.args for i in self.instructions if i.keyword == keyword]


def dockerfile_instructions(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined; comment lines dropped (also inside a
    continued instruction, as Docker does)."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip()))
    if pending:
        raise ValueError("the Dockerfile ends inside a continued instruction")
    return instructions


def dockerfile_stages(text: str) -> list[Stage]:
    stages: list[Stage] = []
    for instruction in dockerfile_instructions(text):
        if instruction.keyword == "FROM":
            parts = instruction.args.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base=parts[0], name=name))
        elif not stages:
            if instruction.keyword != "ARG":
                raise ValueError(f"{instruction.keyword} before the first FROM")
        else:
            stages[-1].instructions.append(instruction)
    return stages


def split_flags(args: str) -> tuple[dict[str, str], list[str]]:
    """``--from=build --chmod=0755 a b`` -> ({"from": "build", "chmod": "0755"}, [a, b])."""
    flags: dict[str, str] = {}
    rest: list[str] = []
    for word in args.split():
        if word.startswith("--") and not rest:
            key, _, value = word[2:].partition("=")
            flags[key] = value
        else:
            rest.append(word)
    return flags, rest


def dockerignore_allows(patterns: list[str], path: str) -> bool:
    """Whether ``path`` (relative to the context) survives the ignore file. Supports what
    ours uses: ``*`` to drop everything, then ``!path`` or ``!dir/`` to bring it back."""
    allowed = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern[1:] if negate else pattern
        body = body.rstrip("/")
        matches = body == "*" or path == body or path.startswith(body + "/")
        if matches:
            allowed = negate
    return allowed


def dockerignore_patterns(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


# ---- compose and dotenv ----

_VARIABLE = re.compile(
    r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:-|:\?|-|\?)(?P<arg>[^}]*))?\}"
)


class MissingVariableError(LookupError):
    pass


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?message}``."""

    def substitute(match: re.Match[str]) -> str:
        name, op, arg = match.group("name"), match.group("op"), match.group("arg")
        current = env.get(name)
        if op in (":-", "-"):
            unset = not current if op == ":-" else current is None
            return arg if unset else str(current)
        if op in (":?", "?"):
            unset = not current if op == ":?" else current is None
            if unset:
                raise MissingVariableError(f"{name}: {arg}")
            return str(current)
        return current or ""

    return _VARIABLE.sub(substitute, value)


def interpolate_tree(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [interpolate_tree(item, env) for item in node]
    if isinstance(node, dict):
        return {key: interpolate_tree(value, env) for key, value in node.items()}
    return node


def compose_variables(text: str) -> set[str]:
    return {match.group("name") for match in _VARIABLE.finditer(text)}


def read_dotenv(text: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"not KEY=VALUE: {raw!r}")
        values[key.strip()] = value.strip()
    return values


# ---- nginx ----


@dataclass
class Block:
    name: str
    args: list[str]
    directives: list[tuple[str, list[str]]] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)

    def values(self, name: str) -> list[list[str]]:
        return [args for directive, args in self.directives if directive == name]

    def value(self, name: str) -> list[str] | None:
        found = self.values(name)
        if len(found) > 1:
            raise AssertionError(f"{name} is set {len(found)} times in {self.name} {self.args}")
        return found[0] if found else None

    def children(self, name: str) -> list[Block]:
        return [block for block in self.blocks if block.name == name]


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|[{};]|[^\s{};"\']+')


def _nginx_tokens(text: str) -> Iterator[str]:
    for line in text.splitlines():
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        for token in _TOKEN.findall(code):
            if token[0] in "\"'":
                token = token[1:-1]
            yield token


def parse_nginx(text: str) -> Block:
    root = Block("main", [])
    stack = [root]
    words: list[str] = []
    for token in _nginx_tokens(text):
        if token == ";":
            if not words:
                raise ValueError("empty directive")
            stack[-1].directives.append((words[0], words[1:]))
            words = []
        elif token == "{":
            block = Block(words[0], words[1:])
            stack[-1].blocks.append(block)
            stack.append(block)
            words = []
        elif token == "}":
            if words or len(stack) == 1:
                raise ValueError("unbalanced block or unterminated directive")
            stack.pop()
        else:
            words.append(token)
    if words or len(stack) != 1:
        raise ValueError("the configuration ends inside a directive or a block")
    return root


def nginx_seconds(value: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    match = re.fullmatch(r"(\d+)(ms|s|m|h|d)?", value)
    if match is None:
        raise ValueError(f"not an nginx time: {value!r}")
    return int(match.group(1)) * units[match.group(2) or "s"]


def nginx_bytes(value: str) -> int:
    units = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
    match = re.fullmatch(r"(\d+)([kmgKMG]?)", value)
    if match is None:
        raise ValueError(f"not an nginx size: {value!r}")
    return int(match.group(1)) * units[match.group(2).lower()]


# ---- secrets ----

_SECRET_PATTERNS = (
    re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"),
    re.compile(r"\bak-[A-Za-z0-9_\-]{16,}"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    re.compile(r"\beyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}"),
)
_TOKEN_CANDIDATE = re.compile(r"[A-Za-z0-9+/=_\-]{20,}")
# Pieces of paths and prose: "infra/k8s/migrate-job", "base64-of-32-random-bytes".
_WORD = re.compile(
    r"(?:[a-z]+|[A-Z][a-z]+)(?:[A-Z][a-z]+)*[0-9]*|[A-Z]+[0-9]*|[0-9]+|[a-z0-9]{1,4}"
)


def _entropy(token: str) -> float:
    counts = Counter(token)
    return -sum(n / len(token) * math.log2(n / len(token)) for n in counts.values())


def real_looking_secrets(text: str) -> list[str]:
    """Strings that look like credentials: known key formats, and long random-looking
    runs (two of lower case, upper case and digits, high entropy, not made of words and
    numbers), as a generated secret is."""
    found = [m.group() for pattern in _SECRET_PATTERNS for m in pattern.finditer(text)]
    for match in _TOKEN_CANDIDATE.finditer(text):
        token = match.group()
        if PLACEHOLDER in token:
            continue
        classes = (str.islower, str.isupper, str.isdigit)
        mixed = sum(any(test(c) for c in token) for test in classes) >= 2
        pieces = [piece for piece in re.split(r"[/_.+=\-]", token) if piece]
        wordy = all(_WORD.fullmatch(piece) for piece in pieces)
        if mixed and not wordy and _entropy(token) >= 3.0:
            found.append(token)
    return found
