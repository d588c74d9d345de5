"""`report` answers "will MTP pay off on my workload?" (issue 26 item 3): what decides it, the random-token
benchmark trap, and the probe command for this checkpoint."""

from __future__ import annotations

import shlex


def _with_tokenizer(make_fixture, tmp_path):
    """The fixture plus a tokenizer file: the probe command is suggested only where the probe can run."""
    import shutil

    path = tmp_path / "deepseek_v3_nvfp4"
    shutil.copytree(make_fixture("deepseek_v3_nvfp4"), path)
    (path / "tokenizer.json").write_text('{"model": {"vocab": {}}}', encoding="utf-8")
    return path


def test_report_says_what_decides_the_payoff(make_fixture, cli, tmp_path) -> None:
    path = _with_tokenizer(make_fixture, tmp_path)
    r = cli("report", str(path), "--wide")
    assert r.returncode == 0, r.stderr
    [row] = [line for line in r.stdout.splitlines() if line.startswith("Pays off?")]
    assert "acceptance on your own traffic" in row and "concurrency" in row and "random" in row
    command = row.split("`")[1]
    assert shlex.split(command)[:3] == ["ckptinspect", "probe", str(path)]


def test_without_a_tokenizer_the_report_suggests_no_probe_command(make_fixture, cli) -> None:
    r = cli("report", str(make_fixture("deepseek_v3_nvfp4")), "--wide")
    [row] = [line for line in r.stdout.splitlines() if line.startswith("Pays off?")]
    assert "`ckptinspect probe` measures" in row and "needs the model's tokenizer" in row and "--gpu" not in row


def test_report_with_a_plan_names_the_plan_gpu(make_fixture, tmp_path) -> None:
    from ckptinspect import api
    from ckptinspect.render.text import sections

    path = _with_tokenizer(make_fixture, tmp_path)
    report = api.inspect(str(path), gpu="rtx-pro-6000", gpus=1)
    [(_, _, rows)] = [s for s in sections(report) if s[0] == "MTP summary"]
    [answer] = [value for key, value in rows if key == "Pays off?"]
    args = shlex.split(answer.split("`")[1])
    assert args[args.index("--gpu") + 1] == "rtx-pro-6000"


def test_no_payoff_section_without_a_usable_draft(make_fixture, cli) -> None:
    r = cli("report", str(make_fixture("deepseek_v3_nvfp4_nomtp")))
    assert r.returncode == 0 and "Pays off?" not in r.stdout
