"""The command's front: help, usage errors (exit 2, one line) and --debug."""

from __future__ import annotations

from pathlib import Path

from clikit import Run, assert_one_line_error


def test_help_lists_every_subcommand(cli: Run) -> None:
    result = cli("--help")
    assert result.returncode == 0
    for command in ("inspect", "convert", "verify", "serve", "bench", "demo"):
        assert command in result.stdout


def test_usage_errors_are_one_line_and_exit_2(cli: Run, main: Run) -> None:
    assert_one_line_error(cli(), 2, "COMMAND", "--help")
    assert_one_line_error(main("frobnicate"), 2, "frobnicate")
    assert_one_line_error(main("inspect"), 2, "PATH_OR_URL")
    assert_one_line_error(main("verify", ".", "--jobs", "many"), 2, "--jobs")


def test_debug_shows_the_traceback(cli: Run, main: Run, tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text("{not json")
    plain = cli("inspect", str(tmp_path))
    assert_one_line_error(plain, 1, "index.json", "not valid JSON")
    debug = main("--debug", "inspect", str(tmp_path))
    assert debug.returncode == 1
    assert "Traceback" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1] == plain.stderr.strip()
