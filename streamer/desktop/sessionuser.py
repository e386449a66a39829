"""Which Unix user a session's programs run as, and the policy that keeps them off root.

Job: a desktop session's window manager and app (and a game command, and the session's PulseAudio)
run as the *session user*: by default the node's own user, or the unprivileged account named by the
node's ``session_user`` setting (the node must then run as root, which may switch to any user).
Programs running as root inside a session would own the host, so a node refuses to start a session
app as root unless ``allow_root_sessions`` says otherwise: ``refusal`` says why, in one sentence,
or None.  The built-in game runs no program and is never refused.

What a session user gets (``prepare_home``, ``env``): a private home folder (0700, owned by that
user) inside the session's scratch folder, ``HOME``/``USER``/``LOGNAME`` pointing at it, nothing
of the node's.  ``spawn_kwargs`` are what ``asyncio.create_subprocess_exec`` needs to start a
program as that user (no supplementary groups: none of root's).

Pure except ``lookup``/``node_user`` (the password database) and ``prepare_home`` (a folder).
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class SessionUser:
    """A Unix account: its name, uid and primary gid."""

    name: str
    uid: int
    gid: int


def lookup(name: str) -> SessionUser:
    """The account ``name`` (or a numeric uid); ``ValueError`` naming it when there is none."""
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, OverflowError):
        raise ValueError(f"session_user {name!r}: no such user on this host") from None
    return SessionUser(entry.pw_name, entry.pw_uid, entry.pw_gid)


def node_user() -> SessionUser:
    """The account this process runs as."""
    uid = os.geteuid()
    try:
        entry = pwd.getpwuid(uid)
        return SessionUser(entry.pw_name, uid, entry.pw_gid)
    except KeyError:  # a container's arbitrary uid with no passwd entry
        return SessionUser(str(uid), uid, os.getegid())


def refusal(user: SessionUser, node_uid: int, allow_root: bool) -> str | None:
    """Why this node must not start session programs as ``user`` (None: it may).  Pure."""
    if user.uid == 0 and not allow_root:
        return ("session programs would run as root: set NODE_SESSION_USER to an unprivileged account "
                "(e.g. nobody) or NODE_ALLOW_ROOT_SESSIONS=true")
    if user.uid != node_uid and node_uid != 0:
        return (f"the node runs as uid {node_uid} and cannot start programs as {user.name} (uid {user.uid}): "
                "run the node as root, or leave NODE_SESSION_USER empty")
    return None


def switches(user: SessionUser | None) -> bool:
    """Programs for ``user`` need a user switch (another account than this process's)."""
    return user is not None and user.uid != os.geteuid()


def spawn_kwargs(user: SessionUser | None) -> dict[str, Any]:
    """``create_subprocess_exec`` arguments that start a program as ``user`` ({} when no switch is needed)."""
    if user is None or not switches(user):
        return {}
    return {"user": user.uid, "group": user.gid, "extra_groups": []}


def prepare_home(parent: Path, user: SessionUser) -> Path:
    """A private home for ``user`` inside ``parent`` (which gets 0711: traversable, not listable)."""
    home = parent / "home"
    home.mkdir(mode=0o700, exist_ok=True)
    if switches(user):
        parent.chmod(0o711)
        os.chown(home, user.uid, user.gid)
    return home


def env(user: SessionUser, home: Path) -> dict[str, str]:
    """The identity variables of a session program run as ``user``."""
    return {"HOME": str(home), "USER": user.name, "LOGNAME": user.name}
