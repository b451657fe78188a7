"""Trained router folders are relocatable and the shipped one is not overwritten by accident (issue 38): a copy
of models/router in another folder loads; metrics.json names the gate's difficulty head relative to the router
folder itself, and an old manifest (relative to the folder's parent) still reads; a bare `gateway train
--from-outcomes` refuses to replace models/router without --force, and --help shows the --out default."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from gateway.classifier.difficulty import EncoderMismatch
from gateway.classifier.quality import load_quality_predictor, open_rubric, read_router_metrics
from gateway.classifier.quality_head import HEAD_FILE
from gateway.cli import main
from gateway.training import router_train

ROOT = Path(__file__).resolve().parents[2]
ROUTER = ROOT / "models" / "router"
DIFFICULTY = ROOT / "models" / "difficulty"


def copy_router(to: Path) -> Path:
    shutil.copytree(ROUTER, to)
    return to


def test_a_copy_of_the_shipped_router_elsewhere_loads_and_predicts_the_same(tmp_path: Path) -> None:
    copy = copy_router(tmp_path / "elsewhere" / "mine")
    rubric = open_rubric(read_router_metrics(copy), copy)
    assert rubric is not None and rubric.path == (DIFFICULTY / HEAD_FILE).resolve()
    shipped, moved = load_quality_predictor(ROUTER), load_quality_predictor(copy)
    try:
        prompt = "Prove that there are infinitely many primes."
        assert asyncio.run(moved.predict(prompt)) == asyncio.run(shipped.predict(prompt))
    finally:
        shipped.close()
        moved.close()


def test_the_gate_names_its_head_relative_to_the_router_folder(tmp_path: Path) -> None:
    from gateway.training.router_train import gate_of

    heads = tmp_path / "kit" / "heads" / "difficulty"
    heads.mkdir(parents=True)
    shutil.copy(DIFFICULTY / HEAD_FILE, heads / HEAD_FILE)
    folder = tmp_path / "kit" / "routers" / "router"
    gate = gate_of(heads, folder, 0.5)
    assert gate["head"] == "../../heads/difficulty" and "head_dir" not in gate
    rubric = open_rubric({"gate": gate}, folder)
    assert rubric is not None and rubric.path == (heads / HEAD_FILE).resolve()  # the named one, not the shipped
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "kit", moved)
    rubric = open_rubric({"gate": gate}, moved / "routers" / "router")
    assert rubric is not None and rubric.path == (moved / "heads" / "difficulty" / HEAD_FILE).resolve()


def test_an_old_manifest_names_the_head_relative_to_the_folders_parent(tmp_path: Path) -> None:
    (tmp_path / "difficulty").mkdir()
    shutil.copy(DIFFICULTY / HEAD_FILE, tmp_path / "difficulty" / HEAD_FILE)
    metrics = json.loads((ROUTER / "metrics.json").read_text())
    assert metrics["gate"]["head_dir"] == "difficulty"  # the shipped manifest is of the old kind
    rubric = open_rubric(metrics, tmp_path / "router")
    assert rubric is not None and rubric.path == (tmp_path / "difficulty" / HEAD_FILE).resolve()


def test_a_head_found_nowhere_is_named_with_where_it_was_looked_for(tmp_path: Path) -> None:
    gate = {"h0": 0.5, "head": "../nowhere-like-this", "head_sha256": "0" * 64}
    with pytest.raises(FileNotFoundError, match="nowhere-like-this"):
        open_rubric({"gate": gate}, tmp_path / "router")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / HEAD_FILE).write_bytes(b"another head")
    with pytest.raises(EncoderMismatch, match="retrain the router after the difficulty head"):
        open_rubric({"gate": gate | {"head": "../other"}}, tmp_path / "router")


def outcomes(tmp_path: Path) -> Path:
    path = tmp_path / "o.jsonl"
    path.write_text(json.dumps({"prompt": "Q?", "scores": {"m7b": 0.0, "m51b": 1.0}}) + "\n")
    return path


def test_a_bare_train_refuses_to_replace_the_shipped_router(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    trained: list[Path] = []

    def fake_train(rows: object, out: Path, **options: object) -> dict[str, object]:
        trained.append(out)
        return {"models": ["m7b"], "training": {"seconds": 0.1}}

    monkeypatch.setattr(router_train, "train_router", fake_train)
    monkeypatch.chdir(ROOT)
    before = (ROUTER / "metrics.json").read_bytes()
    assert main(["train", "--from-outcomes", str(outcomes(tmp_path))]) == 2
    assert "is the shipped router: pass --force" in capsys.readouterr().err
    assert main(["train", "--from-outcomes", str(outcomes(tmp_path)), "--out", str(ROUTER)]) == 2
    assert trained == [] and (ROUTER / "metrics.json").read_bytes() == before
    assert router_train.run_from_outcomes(["--from-outcomes", str(outcomes(tmp_path))]) == 2
    assert main(["train", "--from-outcomes", str(outcomes(tmp_path)), "--force"]) == 0
    assert main(["train", "--from-outcomes", str(outcomes(tmp_path)), "--out", str(tmp_path / "r")]) == 0
    assert [p.resolve() for p in trained] == [ROUTER.resolve(), (tmp_path / "r").resolve()]


def test_train_help_shows_where_the_router_is_written(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--from-outcomes", "x", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default: models/router" in text and "--force" in text
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "default: models/router" in " ".join(capsys.readouterr().out.split())
