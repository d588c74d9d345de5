"""The README stays true: its test command is what CI runs, and every command is documented."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _blocks() -> list[str]:
    return re.findall(r"```\n(.*?)```", README, re.S)


def test_set_up_has_exactly_the_two_commands():
    setup = README.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    commands = [b.strip() for b in re.findall(r"```\n(.*?)```", setup, re.S)]
    assert commands == ["pip install -e . && ckptinspect report",
                        "python -m pip install --require-hashes --no-deps -r requirements/dev.lock && python -m pip install --no-deps --no-build-isolation -e . && python -m pytest -n 2"]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    readme_test_command = "python -m pip install --require-hashes --no-deps -r requirements/dev.lock && python -m pip install --no-deps --no-build-isolation -e . && python -m pytest -n 2"
    assert readme_test_command in ci.splitlines()


def test_every_cli_command_is_documented():
    from ckptinspect.cli import COMMANDS

    for name in COMMANDS:
        assert f"ckptinspect {name}" in README, name


def test_json_contract_keys_are_documented():
    contract = (ROOT / "docs" / "json_contract.md").read_text()
    for key in ('"schema_version"', '"totals"', '"experts"', '"quantization"', '"mtp"', '"findings"',
                '"declared_key"', '"verdict"'):
        assert key in contract


def test_readme_is_a_front_page():
    assert len(README.splitlines()) <= 250
    for doc in re.findall(r"\]\((docs/[\w.]+|CONTRIBUTING\.md|BENCHMARKS\.md)\)", README):
        assert (ROOT / doc).exists(), doc
