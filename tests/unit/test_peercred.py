"""Peer credentials from the kernel, and the pure ACL that decides on them."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from rasd.server.peercred import (
    Acl,
    AclError,
    PeerCred,
    peer_credentials,
    peer_gids,
    peer_groups,
    supplementary_gids,
)

USERS = {"www-data": 33, "batch": 1500}
GROUPS = {"web": 2000, "ops": 2100}


def build(acl: dict[str, list[str]]) -> Acl:
    return Acl.from_config(acl, uid_of=USERS.__getitem__, gid_of=GROUPS.__getitem__)


# -------------------------------------------------------------------------------- the ACL
def test_empty_acl_allows_everyone() -> None:
    """rasd dev's mode: no acl table means any local process may use any client_id."""
    acl = build({})
    assert acl.open
    assert acl.grant(1234, []).allows("anything")
    assert acl.grant(0, [0]).allows("demo")


def test_uid_entry_grants_only_listed_client_ids() -> None:
    """A uid entry grants exactly its client_ids; other ids and other users get nothing."""
    acl = build({"uid.1001": ["demo", "ads"]})
    assert acl.grant(1001, []).allows("demo")
    assert acl.grant(1001, []).allows("ads")
    assert not acl.grant(1001, []).allows("other")
    assert not acl.grant(1002, []).allows("demo")


def test_group_membership_grants_via_any_gid() -> None:
    """A caller is allowed through its primary or any supplementary group."""
    acl = build({"gid.2000": ["demo"], "group.ops": ["ops-pool"]})
    assert acl.grant(5000, [100, 2000]).allows("demo")
    assert acl.grant(5000, [2100]).allows("ops-pool")
    assert not acl.grant(5000, [100]).allows("demo")


def test_grants_are_a_union_across_uid_and_groups() -> None:
    """uid and group grants add up; neither hides the other."""
    acl = build({"user.batch": ["jobs"], "group.web": ["demo"]})
    g = acl.grant(1500, [2000])
    assert g.allows("jobs")
    assert g.allows("demo")
    assert not g.allows("x")


def test_star_grants_every_client_id() -> None:
    """'*' means every client_id, also when mixed with names or granted via a group."""
    acl = build({"user.www-data": ["*"], "gid.7": ["a", "*"]})
    assert acl.grant(33, []).allows("whatever")
    assert acl.grant(99, [7]).allows("zzz")
    assert not acl.grant(99, [8]).allows("a")


def test_root_is_not_implicitly_allowed() -> None:
    """Root gets no free pass once an acl exists: uid 0 must be listed like anyone else."""
    acl = build({"uid.1001": ["demo"]})
    assert not acl.grant(0, [0]).allows("demo")
    assert build({"uid.0": ["demo"]}).grant(0, [0]).allows("demo")


def test_empty_list_grants_nothing_but_closes_the_acl() -> None:
    """An entry with no client_ids still turns the ACL on (deny by default for others)."""
    acl = build({"uid.1001": []})
    assert not acl.open
    assert not acl.grant(1001, []).allows("demo")
    assert not acl.grant(1002, []).allows("demo")


def test_entries_for_the_same_id_merge() -> None:
    """user.NAME and uid.N naming the same account add up instead of overwriting."""
    acl = build({"user.batch": ["a"], "uid.1500": ["b"]})
    assert acl.grant(1500, []).allows("a")
    assert acl.grant(1500, []).allows("b")


@pytest.mark.parametrize(
    ("acl", "message"),
    [
        ({"uid.abc": ["x"]}, "not a uid number"),
        ({"gid.-1": ["x"]}, "not a gid number"),
        ({"uid.": ["x"]}, "expected uid.N"),
        ({"demo": ["x"]}, "expected uid.N"),
        ({"host.web1": ["x"]}, "unknown kind"),
        ({"user.nobody-here": ["x"]}, "no such user"),
        ({"group.nope": ["x"]}, "no such group"),
        ({"uid.1": "demo"}, "list of client_ids"),
        ({"uid.1": [""]}, "list of client_ids"),
    ],
)
def test_bad_entries_are_rejected_with_the_entry_named(
    acl: dict[str, list[str]], message: str
) -> None:
    """A typo in the acl stops the daemon with a message naming the entry, instead of
    silently locking users out (or in)."""
    with pytest.raises(AclError, match=message) as info:
        build(acl)
    assert repr(next(iter(acl))) in str(info.value)


def test_from_config_default_resolvers_use_the_system_database() -> None:
    """Real pwd/grp resolution: this process's own user and group names resolve."""
    import grp
    import pwd

    me = pwd.getpwuid(os.getuid()).pw_name
    mygroup = grp.getgrgid(os.getgid()).gr_name
    acl = Acl.from_config({f"user.{me}": ["a"], f"group.{mygroup}": ["b"]})
    assert acl.grant(os.getuid(), []).allows("a")
    assert acl.grant(12345, [os.getgid()]).allows("b")


def test_acl_from_toml_config_shape() -> None:
    """The flattened shape rasd.config produces from `[acl] uid.1001 = [...]` is accepted."""
    import tomllib

    from rasd.config import _flatten_acl

    doc = _flatten_acl(tomllib.loads('[acl]\nuid.1001 = ["demo"]\ngroup.web = ["*"]\n'))
    acl = build(doc["acl"])
    assert acl.grant(1001, []).allows("demo")
    assert acl.grant(1, [2000]).allows("x")


# ---------------------------------------------------------------------- kernel credentials
def test_peer_credentials_of_a_socketpair_is_this_process() -> None:
    """SO_PEERCRED reports the connecting process: here, ourselves."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        cred = peer_credentials(a)
        assert cred == PeerCred(os.getpid(), os.geteuid(), os.getegid())
        pid, uid, gid = cred  # unpacks as (pid, uid, gid)
        assert (pid, uid, gid) == (os.getpid(), os.geteuid(), os.getegid())


def test_peer_gids_include_primary_and_supplementary() -> None:
    """The gids used for the ACL contain the primary gid and our supplementary groups."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        gids = peer_gids(a, peer_credentials(a))
        assert os.getegid() in gids
        assert set(os.getgroups()) <= gids
        groups = peer_groups(a)
        if groups is not None:  # SO_PEERGROUPS available (Linux >= 4.13)
            assert groups == frozenset(os.getgroups())


async def test_peer_credentials_through_an_asyncio_transport(tmp_path: Path) -> None:
    """The server gets the socket from transport.get_extra_info('socket'): that object
    (a TransportSocket, or uvloop's equivalent) works too."""
    seen: list[PeerCred] = []
    made = asyncio.Event()

    class P(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            seen.append(peer_credentials(transport.get_extra_info("socket")))
            transport.close()
            made.set()

    path = str(tmp_path / "s.sock")
    server = await asyncio.get_running_loop().create_unix_server(P, path=path)
    async with server:
        _, w = await asyncio.open_unix_connection(path)
        await made.wait()
        w.close()
    assert seen == [PeerCred(os.getpid(), os.geteuid(), os.getegid())]


def test_supplementary_gids_reads_proc_status(tmp_path: Path) -> None:
    """The /proc fallback parses the Groups line and checks the effective uid."""
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "status").write_text(
        "Name:\tpython\nUid:\t1000\t1001\t1001\t1001\nGid:\t1000\t1000\t1000\t1000\n"
        "Groups:\t4 24 2000 \n"
    )
    assert supplementary_gids(42, proc=str(tmp_path)) == {4, 24, 2000}
    assert supplementary_gids(42, expect_uid=1001, proc=str(tmp_path)) == {4, 24, 2000}
    # pid reused by another user: no groups rather than someone else's
    assert supplementary_gids(42, expect_uid=1000, proc=str(tmp_path)) == frozenset()
    assert supplementary_gids(43, proc=str(tmp_path)) == frozenset()


def test_supplementary_gids_of_this_process() -> None:
    """On the real /proc, our own groups come back."""
    assert supplementary_gids(os.getpid(), expect_uid=os.geteuid()) == frozenset(os.getgroups())
