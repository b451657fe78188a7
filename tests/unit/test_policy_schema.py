import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_committed_json_schemas_match_the_models() -> None:
    for args, path in (([], "policies/schema.json"), (["--routes"], "routes/schema.json")):
        printed = subprocess.run([sys.executable, "-m", "gateway", "policy", "schema", *args],
                                 capture_output=True, text=True, check=True).stdout
        assert json.loads(printed) == json.loads((ROOT / path).read_text()), f"regenerate {path}"


def test_the_annotated_example_is_valid_with_the_emulator_routes() -> None:
    from gateway.config import load_config

    config = load_config(ROOT / "routes/emulator.yaml", ROOT / "policies/example.yaml")
    batch = next(t for t in config.tenants_by_key_hash.values() if t.name == "team-batch")
    assert batch.priority == "batch" and batch.allowed_tiers == {"small-int4", "medium-int8"}
    assert batch.cache.ttl_s == 3600 and batch.output_cap is not None  # inherited from the top level
