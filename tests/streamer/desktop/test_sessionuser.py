"""Session programs off root: the policy, and a desktop and its sound really running as an unprivileged account.

The real-process tests switch to ``nobody``, which needs this test run to be root (CI runs as root);
elsewhere they skip, saying so.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
from pathlib import Path

import pytest

from streamer.desktop import sessionuser
from streamer.desktop.display import DisplayConfig, VirtualDisplay
from streamer.desktop.sessionuser import SessionUser, refusal
from tests.procs import alive

ROOT = SessionUser("root", 0, 0)
NOBODY_UID = 65534


def test_root_sessions_are_refused_unless_allowed() -> None:
    why = refusal(ROOT, node_uid=0, allow_root=False)
    assert why is not None and "NODE_SESSION_USER" in why and "NODE_ALLOW_ROOT_SESSIONS" in why
    assert refusal(ROOT, node_uid=0, allow_root=True) is None
    nobody = SessionUser("nobody", NOBODY_UID, NOBODY_UID)
    assert refusal(nobody, node_uid=0, allow_root=False) is None  # root may switch to anyone
    assert refusal(nobody, node_uid=NOBODY_UID, allow_root=False) is None  # a node run as the account itself
    other = refusal(nobody, node_uid=1000, allow_root=False)  # an unprivileged node cannot switch
    assert other is not None and "uid 1000" in other and "nobody" in other


def test_lookup_names_the_setting_for_an_unknown_account() -> None:
    with pytest.raises(ValueError, match="session_user 'no-such-user-rb': no such user"):
        sessionuser.lookup("no-such-user-rb")
    assert sessionuser.lookup("0").name == pwd.getpwuid(0).pw_name
    me = sessionuser.node_user()
    assert me.uid == os.geteuid() and sessionuser.spawn_kwargs(me) == {} and sessionuser.spawn_kwargs(None) == {}


def _status_ids(pid: int) -> tuple[int, int, list[int]]:
    """(uid, gid, supplementary groups) of a live process, from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0]), [int(g) for g in fields["Groups"].split()]


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_text()
    return dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def _owner_and_mode(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_uid, st.st_mode & 0o777


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching to another account needs root")


@needs_root
@pytest.mark.timeout(60)
@pytest.mark.skipif(any(shutil.which(t) is None for t in ("Xvfb", "openbox", "xdpyinfo")),
                    reason="needs Xvfb, openbox and xdpyinfo (Debian xvfb, openbox, x11-utils)")
async def test_a_desktop_as_nobody_reaches_its_display_and_owns_a_private_home(tmp_path: Path) -> None:
    nobody = sessionuser.lookup("nobody")
    marker = "reached"
    # the app proves what it can do: talk to its X server, write its HOME; then it waits to be stopped
    app = ("sh", "-c", f'xdpyinfo >/dev/null && echo {marker} > "$HOME/probe" && exec sleep 60')
    env = {"PATH": os.environ["PATH"], "HOME": "/root", "USER": "root"}
    display = VirtualDisplay(DisplayConfig(width=320, height=240, app=app, env=env, user=nobody))
    await display.start()
    try:
        pids = display.pids
        for role in ("wm", "app"):
            uid, gid, groups = _status_ids(pids[role])
            assert (uid, gid) == (nobody.uid, nobody.gid), role
            assert 0 not in groups, f"{role} kept root's supplementary groups"
        assert _status_ids(pids["xvfb"])[0] == os.geteuid()  # the X server stays the node's
        app_env = _environ(pids["app"])
        home = Path(app_env["HOME"])
        assert app_env["USER"] == app_env["LOGNAME"] == "nobody" and home != Path("/root")
        probe = home / "probe"
        for _ in range(100):
            if _read(probe) is not None:
                break
            await asyncio.sleep(0.05)
        assert _read(probe) == marker
        assert _owner_and_mode(home) == (nobody.uid, 0o700)
    finally:
        await display.close()
    assert not any(alive(pid) for pid in pids.values())
    assert _owner_and_mode(home) is None  # removed with the display
