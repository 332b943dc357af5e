"""`mcp_server.py --search` into a reader that leaves early (`| head`): no traceback."""

import json
import os
import subprocess
import sys

from kb_fixtures import REPO_ROOT


def test_search_into_a_pipe_closed_early_ends_without_a_traceback(small_vault, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
    config = tmp_path / "config.yaml"
    config.write_text(
        json.dumps({"kb_dir": str(small_vault), "data_dir": str(tmp_path / "data"), "embedding": {"model": "hash-embedder"}})
    )
    cmd = [sys.executable, str(REPO_ROOT / "mcp_server.py"), "--config", str(config), "--search", "backup"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(1)  # type: ignore[union-attr]  # the first byte, then leave, as `head -c 1` does
    proc.stdout.close()  # type: ignore[union-attr]
    err = proc.stderr.read().decode("utf-8", "replace")  # type: ignore[union-attr]
    assert proc.wait(timeout=60) == 0, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
