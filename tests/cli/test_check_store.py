"""``burst check`` against a real S3 store (SeaweedFS): every store row passes with a key
that may write; with a read-only key the write row fails, with its fix, one line per row."""

from __future__ import annotations

from click.testing import CliRunner

from burst.cli import main
from tests.preflight.servers import store_env, two_key_s3  # noqa: F401 - the fixture

STORE_ROWS = ("store write", "store read", "store conditional write", "store delete")


def check(url: str) -> tuple[int, list[str]]:
    result = CliRunner().invoke(main, ["check", "--store", url, "--to", "local"])
    assert "Traceback" not in result.output
    return result.exit_code, result.output.splitlines()


def test_a_healthy_s3_store_passes_every_row(two_key_s3, monkeypatch, tmp_path):  # noqa: F811
    store_env(monkeypatch, two_key_s3, tmp_path)
    code, lines = check(two_key_s3.url())
    assert code == 0, lines
    for name in STORE_ROWS:
        assert any(line.startswith(f"✓ {name}: ok") for line in lines), (name, lines)
    assert lines[-1] == "ready"


def test_a_read_only_key_fails_the_write_row_with_the_fix(two_key_s3, monkeypatch,  # noqa: F811
                                                         tmp_path):
    store_env(monkeypatch, two_key_s3, tmp_path, read_only=True)
    code, lines = check(two_key_s3.url())
    assert code == 1
    write = next(line for line in lines if " store write" in line)
    assert write.startswith("✗ store write: fail:") and "read-only key" in write.split("fix:")[1]
    assert any(line.startswith("? store read: unknown") for line in lines)
    assert lines[-1].startswith("not ready: store write")
