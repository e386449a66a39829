"""Scratch folders: a folder whose owner died is swept, a live owner's and an unrelated one are kept."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from rbcommon.procs import OWNER_FILE, UNOWNED_GRACE_S, owned_tmpdir, sweep_stale_tmpdirs


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_only_folders_of_dead_owners_and_old_unowned_ones_are_swept(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = owned_tmpdir("render-display-")
    assert mine.parent == tmp_path and (mine / OWNER_FILE).read_text() == str(os.getpid())
    orphan = owned_tmpdir("render-audio-", owner=dead_pid())
    (orphan / "pulse.sock").write_text("")
    fresh_unowned = tmp_path / "render-display-new"
    fresh_unowned.mkdir()
    old_unowned = tmp_path / "render-display-old"
    old_unowned.mkdir()
    past = time.time() - UNOWNED_GRACE_S - 60
    os.utime(old_unowned, (past, past))
    other = tmp_path / "somebody-else"
    other.mkdir()
    (tmp_path / "render-display-file").write_text("not a folder")

    removed = sweep_stale_tmpdirs(("render-display-", "render-audio-"), root=str(tmp_path))

    assert sorted(p.name for p in removed) == sorted([orphan.name, old_unowned.name])
    assert not orphan.exists() and not old_unowned.exists()
    assert mine.exists() and fresh_unowned.exists() and other.exists()
    assert (tmp_path / "render-display-file").exists()
