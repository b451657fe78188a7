"""Load YAML config files into frozen objects; every problem names file, line, field and value."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import re

import yaml
from pydantic import BaseModel, ValidationError

from gateway.backends.urls import redact_url, redact_urls_in
from gateway.config.policies import PolicyConfig
from gateway.config.routes import RoutesConfig

Model = TypeVar("Model", bound=BaseModel)
Loc = tuple[int | str, ...]


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    file: str
    line: int | None
    field: str
    value: str
    reason: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.field}: {self.reason} (got {self.value})"


class ConfigError(Exception):
    """A config file was refused; `issues` says where and why."""

    def __init__(self, issues: list[ConfigIssue]) -> None:
        super().__init__("\n".join(str(i) for i in issues))
        self.issues = tuple(issues)


def load_routes(path: str | Path) -> RoutesConfig:
    return _load(RoutesConfig, Path(path))


def load_policy(path: str | Path) -> PolicyConfig:
    return _load(PolicyConfig, Path(path))


def check_file(path: str | Path) -> list[ConfigIssue]:
    """Validate one routes or policy file (told apart by a top-level `tiers` key)."""
    file = Path(path)
    try:
        data, _ = _read(file)
        model: type[BaseModel] = RoutesConfig if isinstance(data, dict) and "tiers" in data else PolicyConfig
        _load(model, file)
    except ConfigError as err:
        return list(err.issues)
    return []


def locate(err: ConfigError, file: str | Path) -> ConfigError:
    """`err`'s issues placed in `file` (a policy the cross-file rules refused), each with the line of its field."""
    path = Path(file)
    _, node = _read(path)
    return ConfigError([ConfigIssue(str(path), issue.line or _line_of_field(node, issue.field), issue.field,
                                    issue.value, issue.reason) for issue in err.issues])


def field_line(file: str | Path, field: str) -> int | None:
    """The 1-based line of `field` (like `tenants[2].rate_limit`) in `file`, or of its closest parent; None for
    the empty field (the document) or a file that does not read."""
    if not field:
        return None
    try:
        _, node = _read(Path(file))
    except ConfigError:
        return None
    return _line_of_field(node, field)


def _load(model: type[Model], file: Path) -> Model:
    data, node = _read(file)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError([_issue(file, node, e) for e in err.errors()]) from None


def _read(file: Path) -> tuple[Any, yaml.Node | None]:
    try:
        text = file.read_text(encoding="utf-8")
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except OSError as err:
        raise ConfigError([ConfigIssue(str(file), None, "(file)", str(file), err.strerror or str(err))]) from None
    except UnicodeDecodeError:
        raise ConfigError([ConfigIssue(str(file), None, "(file)", "bytes", "not UTF-8 text")]) from None
    except RecursionError:  # PyYAML recurses once per nesting level (found by fuzzing)
        issue = ConfigIssue(str(file), None, "(document)", "-", "invalid YAML: nested too deeply")
        raise ConfigError([issue]) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        reason = redact_urls_in(f"invalid YAML: {getattr(err, 'problem', None) or err}")  # may quote the line
        raise ConfigError([ConfigIssue(str(file), line, "(document)", "-", reason)]) from None
    return data, node


def _issue(file: Path, node: yaml.Node | None, error: Any) -> ConfigIssue:
    loc: Loc = tuple(error["loc"])
    field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or "(document)"
    value = error.get("input")
    shown = "nothing" if error["type"] == "missing" else repr(redacted(value))
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ConfigIssue(str(file), _line_of(node, loc), field, shown, redact_urls_in(error["msg"]))


def redacted(value: Any) -> Any:
    """`value` (a field's input: a string, or a mapping or list holding some) with the secrets of every URL in it
    replaced (`gateway.backends.urls.redact_url`): a replica URL that does not parse is shown to whoever reads the
    issue (/admin/config, log lines, `policy check`) without its credentials."""
    if isinstance(value, str):
        return redact_url(value) if "://" in value else value
    if isinstance(value, dict):
        return {key: redacted(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [redacted(item) for item in value]
    return value


_INDEX = re.compile(r"\[(\d+)\]")


def _line_of_field(node: yaml.Node | None, field: str) -> int | None:
    """The 1-based line of a field named like `tenants[0].tier_map.llama-3.1` (a key may hold dots: the longest
    key that fits wins), or of its closest existing parent."""
    if node is None:
        return None
    rest = field
    while rest:
        child: yaml.Node | None = None
        taken = 0
        index = _INDEX.match(rest)
        if isinstance(node, yaml.SequenceNode) and index and int(index[1]) < len(node.value):
            child, taken = node.value[int(index[1])], index.end()
        elif isinstance(node, yaml.MappingNode):
            fits = [(str(k.value), v) for k, v in node.value
                    if isinstance(getattr(k, "value", None), str) and _heads(rest, str(k.value))]
            if fits:
                key, child = max(fits, key=lambda pair: len(pair[0]))
                taken = len(key)
        if child is None:
            break
        node, rest = child, rest[taken:].removeprefix(".")
    return node.start_mark.line + 1


def _heads(field: str, key: str) -> bool:
    return field == key or field.startswith((key + ".", key + "["))


def _line_of(node: yaml.Node | None, loc: Loc) -> int | None:
    """The 1-based line of the YAML node at `loc`, or of its closest existing parent."""
    if node is None:
        return None
    for part in loc:
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            child = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            child = node.value[part]
        if child is None:
            break
        node = child
    return node.start_mark.line + 1
