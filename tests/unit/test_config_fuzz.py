"""Property tests of the config loaders: random text, random YAML structures and random edits of
the shipped files are either loaded or refused with a ConfigError naming the file and a field,
never another exception."""

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import ConfigError, check_file, load_config
from gateway.config.loader import load_policy, load_routes

ROOT = Path(__file__).resolve().parents[2]
ROUTES = yaml.safe_load((ROOT / "routes" / "emulator.yaml").read_text())
POLICY = yaml.safe_load((ROOT / "policies" / "example.yaml").read_text())
FUZZ = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                    st.text(max_size=20), st.dates())
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)), max_leaves=20)
YAMLISH = st.lists(st.sampled_from(list("ab:-[]{},&*!?|>'\"#%@` \n\t\r0123456789.") + ["tiers", "name", "!!"]),
                   max_size=120).map("".join)


def refused_cleanly(path: Path, load: object) -> None:
    """`load(path)` succeeds, or raises a ConfigError whose every issue names `path` and a field."""
    try:
        load(path)  # type: ignore[operator]
    except ConfigError as err:
        assert err.issues
        for issue in err.issues:
            assert issue.file == str(path) and issue.field and issue.reason


@pytest.mark.parametrize("load", [load_routes, load_policy, check_file], ids=["routes", "policy", "check"])
@FUZZ
@given(text=st.one_of(st.text(max_size=300), YAMLISH))
def test_random_text_is_refused_cleanly(tmp_path: Path, load: object, text: str) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(text, encoding="utf-8")
    refused_cleanly(path, load)


@FUZZ
@given(data=st.binary(max_size=200))
def test_random_bytes_are_refused_cleanly(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(data)
    refused_cleanly(path, load_policy)


@pytest.mark.parametrize("load", [load_routes, load_policy], ids=["routes", "policy"])
@FUZZ
@given(value=VALUES)
def test_random_structures_are_refused_cleanly(tmp_path: Path, load: object, value: object) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(value))
    refused_cleanly(path, load)


def paths_of(node: object, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside a YAML document."""
    found = [prefix]
    if isinstance(node, dict):
        for key, child in node.items():
            found += paths_of(child, (*prefix, key))
    elif isinstance(node, list):
        for i, child in enumerate(node):
            found += paths_of(child, (*prefix, i))
    return found


def edited(document: object, path: tuple, value: object, delete: bool) -> object:
    if not path:
        return value
    copy = yaml.safe_load(yaml.safe_dump(document))
    parent = copy
    for part in path[:-1]:
        parent = parent[part]
    if delete and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return copy


@FUZZ
@given(which=st.sampled_from(["routes", "policy"]), data=st.data(), value=VALUES, delete=st.booleans())
def test_random_edits_of_the_shipped_files_are_refused_cleanly(tmp_path: Path, which: str, data: st.DataObject,
                                                               value: object, delete: bool) -> None:
    document = ROUTES if which == "routes" else POLICY
    path = data.draw(st.sampled_from(paths_of(document)))
    routes, policy = tmp_path / "routes.yaml", tmp_path / "policy.yaml"
    routes.write_text(yaml.safe_dump(edited(ROUTES, path, value, delete) if which == "routes" else ROUTES))
    policy.write_text(yaml.safe_dump(edited(POLICY, path, value, delete) if which == "policy" else POLICY))
    try:
        load_config(routes, policy)
    except ConfigError as err:
        assert err.issues and all(i.file in (str(routes), str(policy)) and i.field for i in err.issues)


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, "- " * 5000 + "x", "a: {" * 3000 + "}" * 3000],
                         ids=["flow lists", "block sequences", "flow mappings"])
def test_deeply_nested_yaml_is_refused_not_a_recursion_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_routes(path)
    assert "nested too deeply" in str(refused.value) or refused.value.issues[0].file == str(path)
