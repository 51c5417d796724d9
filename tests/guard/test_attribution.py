"""Attribution alone: which slice a process is charged to, from its environment,
its slot or its user, and what is refused. Real slice files, real /proc entries
(this test process and children), slots written into the SliceSet by hand."""

import os
import subprocess
from types import SimpleNamespace

import pytest
from guard_helpers import wait_exec

from hami_jupyter.agent.facts.attribution import ENVIRON, SLOT, USER, Attributor, library_path
from hami_jupyter.agent.facts.procs import ProcessFacts, ProcessTable, pid_namespace, read_facts
from hami_jupyter.processes import start_ticks
from hami_jupyter.agent.facts.slices import SliceFiles
from hami_jupyter.slice.create import ensure_slice
from hami_jupyter.slice.settings import resolve_limits

MiB = 1 << 20
ME = os.getpid()
MY_NS = pid_namespace(ME)


@pytest.fixture
def root(tmp_path):
    path = tmp_path / "slices"
    path.mkdir(mode=0o700)
    for name in ("alice", "bob"):
        ensure_slice(path / f"{name}.slice", name, resolve_limits({"memory_limit": "1g"}, {}))
    return path


def read(root):
    errors = []
    found = SliceFiles(root).read(errors)
    assert errors == []
    return found


def facts(environ=None, uid=None, user="nobody-here", pid=ME, pid_ns=MY_NS, ns_pid=None):
    return ProcessFacts(pid, start_ticks(pid), os.getuid() if uid is None else uid, user, pid_ns,
                        pid if ns_pid is None else ns_pid, environ)


def with_slot(slices, name, pid_ns, pid):
    seen = slices.readable[name]
    slices.slots.setdefault((pid_ns, pid), []).append((seen, SimpleNamespace(pid=pid, pid_ns=pid_ns)))
    return slices


def test_a_slice_named_in_the_environment_under_its_root(root):
    got = Attributor().attribute(facts({"HAMI_SLICE": "alice", "HAMI_SLICE_ROOT": str(root)}), read(root))
    assert (got.seen.name, got.by, got.preload) == ("alice", ENVIRON, False)


def test_a_slice_path_in_the_environment_and_hamis_variable(root):
    a = Attributor()
    got = a.attribute(facts({"CUDA_DEVICE_MEMORY_SHARED_CACHE": str(root / "bob.slice")}), read(root))
    assert (got.seen.name, got.by) == ("bob", ENVIRON)
    # HAMI_SLICE wins over HAMi's name, as in the library.
    both = {"HAMI_SLICE": str(root / "alice.slice"), "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(root / "bob.slice")}
    assert Attributor().attribute(facts(both), read(root)).seen.name == "alice"


def test_the_path_is_matched_by_the_file_not_its_spelling(root, tmp_path):
    # The same folder under another name (a container's mount, a link): the same file.
    (tmp_path / "elsewhere").symlink_to(root)
    got = Attributor().attribute(facts({"HAMI_SLICE": str(tmp_path / "elsewhere" / "alice.slice")}), read(root))
    assert (got.seen.name, got.by) == ("alice", ENVIRON)


def test_a_process_of_another_user_is_never_charged_to_a_slice_it_names(root):
    stranger = facts({"HAMI_SLICE": str(root / "alice.slice")}, uid=os.getuid() + 4242)
    got = Attributor().attribute(stranger, read(root))
    assert got.seen is None and "no slice" in got.why


def test_a_users_process_outside_any_slice_of_the_root_is_charged_to_their_slice(root, tmp_path):
    own = tmp_path / "mine"
    own.mkdir()
    ensure_slice(own / "alice.slice", "alice", resolve_limits({}, {}))  # a file of the user's own
    got = Attributor().attribute(facts({"HAMI_SLICE": str(own / "alice.slice")}, user="alice"), read(root))
    assert (got.seen.name, got.by, got.preload) == ("alice", USER, False)
    got = Attributor().attribute(facts(None, user="bob"), read(root))
    assert (got.seen.name, got.by) == ("bob", USER)
    assert Attributor().attribute(facts(None, user="carol"), read(root)).seen is None


def test_a_slot_in_another_pid_namespace_is_found(root):
    slices = with_slot(read(root), "bob", 4026539999, 7)
    got = Attributor().attribute(facts(None, pid_ns=4026539999, ns_pid=7), slices)
    assert (got.seen.name, got.by, got.preload) == ("bob", SLOT, True)
    # The same PID in our namespace is another process.
    assert Attributor().attribute(facts(None, ns_pid=7), slices).seen is None


def test_environment_and_slot_agreeing_means_the_preload_and_a_slot_elsewhere_wins(root):
    env = {"HAMI_SLICE": str(root / "alice.slice")}
    got = Attributor().attribute(facts(env), with_slot(read(root), "alice", MY_NS, ME))
    assert (got.seen.name, got.by, got.preload) == ("alice", ENVIRON, True)
    # It started naming alice, but the library counts it in bob (HAMI_SLICE changed before cuInit).
    got = Attributor().attribute(facts(env), with_slot(read(root), "bob", MY_NS, ME))
    assert (got.seen.name, got.by, got.preload) == ("bob", SLOT, True)


def test_a_fake_slot_cannot_claim_another_users_process(root):
    slices = with_slot(read(root), "alice", MY_NS, ME)
    got = Attributor().attribute(facts(None, uid=os.getuid() + 4242), slices)
    assert got.seen is None


def test_another_users_slot_naming_a_process_does_not_hide_its_own(root):
    """Issue 33: a user writes a slot naming someone else's process into her own
    file. It is no slot of that process, and the process's own slot still is."""
    slices = read(root)
    slices.readable["bob"].owner_uid = os.getuid() + 4242  # bob's file is another user's
    for name in ("bob", "alice", "bob"):  # before and after the real one
        with_slot(slices, name, MY_NS, ME)
    got = Attributor().attribute(facts(None), slices)
    assert (got.seen.name, got.by, got.preload) == ("alice", SLOT, True)


def test_a_process_naming_an_unreadable_slice_is_not_charged_elsewhere(root):
    (root / "alice.slice").write_bytes(b"not a slice file" * 100)
    errors = []
    slices = SliceFiles(root).read(errors)
    assert any(e.startswith("slice alice: cannot be read") for e in errors)
    got = Attributor().attribute(facts({"HAMI_SLICE": str(root / "alice.slice")}, user="alice"), slices)
    assert got.seen is None and got.why == "its slice alice cannot be read"
    assert Attributor().attribute(facts(None, user="alice"), slices).seen is None


def test_the_library_resolution_of_a_bare_name(tmp_path):
    proc = tmp_path / "proc"
    (proc / "77" / "root").mkdir(parents=True)

    def path(env, uid=1000):
        return library_path(ProcessFacts(77, 1, uid, None, None, None, env), str(proc))

    assert path({"HAMI_SLICE": "a", "HAMI_SLICE_ROOT": "/x"}) == "/x/a.slice"
    assert path({"HAMI_SLICE": "a", "XDG_RUNTIME_DIR": "/run/user/1000"}) == "/run/user/1000/hami-jupyter/a.slice"
    assert path({"HAMI_SLICE": "a"}) == "/tmp/hami-jupyter-1000/a.slice"
    assert path({"HAMI_SLICE": "../a/b.slice"}) == "../a/b.slice"
    assert path({"HAMI_SLICE": ""}) is None and path({}) is None
    assert path({"HAMI_SLICE": "no good"}) is None
    (proc / "77" / "root" / "run" / "hami-jupyter").mkdir(parents=True)  # the hub's root, as it sees it
    assert path({"HAMI_SLICE": "a", "XDG_RUNTIME_DIR": "/x"}) == "/run/hami-jupyter/a.slice"


# ---- /proc ------------------------------------------------------------------------------


def test_the_facts_of_a_real_process(tmp_path):
    env = {"PATH": os.environ["PATH"], "HAMI_SLICE": "alice", "HAMI_CONTEXT_OVERHEAD": "128m",
           "SECRET": "not kept"}
    child = subprocess.Popen(["sleep", "30"], env=env)
    try:
        wait_exec(child, "sleep")
        found = read_facts(child.pid)
        assert found.slice_ref == "alice"
        # Only what finds the slice: nothing else of its user's environment (issue 39).
        assert "SECRET" not in found.environ and "HAMI_CONTEXT_OVERHEAD" not in found.environ
        assert (found.uid, found.pid_ns, found.ns_pid) == (os.getuid(), MY_NS, child.pid)
        table = ProcessTable()
        assert table.facts(child.pid) is table.facts(child.pid)  # cached
    finally:
        child.kill()
        child.wait()
    assert ProcessTable().facts(child.pid) is None


def test_start_time_survives_an_odd_process_name(tmp_path):
    proc = tmp_path / "proc"
    (proc / "5").mkdir(parents=True)
    fields = ["S"] + [str(n) for n in range(4, 22)] + ["987654"] + ["0"] * 30
    (proc / "5" / "stat").write_text("5 (a) b (c) " + " ".join(fields) + "\n")
    assert start_ticks(5, str(proc)) == 987654
    table = ProcessTable(str(proc))
    first = table.facts(5)
    assert first.start_ticks == 987654
    fields[19] = "987999"  # the PID now names another process
    (proc / "5" / "stat").write_text("5 (x) " + " ".join(fields) + "\n")
    assert table.facts(5).start_ticks == 987999 and table.facts(5) is not first


def test_an_environment_not_readable_yet_is_read_again(tmp_path):
    proc = tmp_path / "proc"
    (proc / "6").mkdir(parents=True)
    fields = ["S"] + ["0"] * 18 + ["4242"] + ["0"] * 30
    (proc / "6" / "stat").write_text("6 (python) " + " ".join(fields) + "\n")
    (proc / "6" / "environ").write_bytes(b"")  # caught in the middle of its exec
    table = ProcessTable(str(proc))
    assert table.facts(6).environ is None and table.facts(6).slice_ref is None
    (proc / "6" / "environ").write_bytes(b"PATH=/bin\0HAMI_SLICE=alice\0")
    assert table.facts(6).slice_ref == "alice"
    assert table.facts(6) is table.facts(6)  # and now it is kept


# ---- a slice file the agent cannot read or trust (issue 39, row 1) ------------------------


def _broken(root, how):
    """alice's slice file made untrustworthy as a user can make her own."""
    path = root / "alice.slice"
    if how == "writable by all":
        path.chmod(0o666)
    else:
        with open(path, "r+b") as f:
            f.write(b"junk in its header")
    return path


@pytest.mark.parametrize("how", ["writable by all", "junk in its header"])
def test_a_broken_slice_with_a_limits_file_holds_its_users_processes_to_that_cap(root, how):
    from hami_jupyter.agent.guard.policy import OVER, measure
    from hami_jupyter.agent.facts.look import Placed
    from hami_jupyter.slice.create import create_limits_file
    from hami_jupyter.slice.limits import Limits

    create_limits_file(root / "alice.slice", Limits(memory_limit=1 << 30), mode=0o644)
    _broken(root, how)
    errors = []
    slices = SliceFiles(root).read(errors)
    assert any(e.startswith("slice alice: cannot be read") and "held to the cap of its limits file" in e
               for e in errors), errors
    assert "alice" not in slices.readable and "alice" in slices.enforced
    for environ, by in (({"HAMI_SLICE": "alice", "HAMI_SLICE_ROOT": str(root)}, ENVIRON), (None, USER)):
        got = Attributor().attribute(facts(environ, user="alice"), slices)
        assert (got.seen.name, got.by, got.preload) == ("alice", by, False)
    # A process of another user is no process of hers.
    assert Attributor().attribute(facts(None, uid=os.getuid() + 4242, user="alice"), slices).seen is None
    kernel = Placed("GPU-0", 700 * MiB, facts({"HAMI_SLICE": "alice", "HAMI_SLICE_ROOT": str(root)},
                                             user="alice"), None)
    kernel = Placed(kernel.uuid, kernel.used_bytes, kernel.facts, Attributor().attribute(kernel.facts, slices))
    measured, unattributed = measure({"GPU-0"}, [kernel, Placed("GPU-0", 600 * MiB, kernel.facts, kernel.attribution)],
                                     slices)
    g = measured["alice"]["GPU-0"]
    assert (g.limit_bytes, g.state, unattributed) == (1 << 30, OVER, [])


def test_a_limit_only_its_user_wrote_is_no_cap_the_guard_holds_her_to(root):
    """Item 13: without a limits file, a slice file of hers says what she
    wrote (the agent, as root, does not own it): the guard enforces no cap."""
    from hami_jupyter.agent.facts.look import Placed
    from hami_jupyter.agent.guard.policy import OK, measure

    if os.geteuid() != 0:
        pytest.skip("needs root: the slice file is given to another user")
    os.chown(root / "alice.slice", 4242, 4242)
    slices = read(root)
    assert not slices.readable["alice"].limits_trusted
    mine = facts(None, uid=4242, user="alice")
    placed = [Placed("GPU-0", 3 << 30, mine, Attributor().attribute(mine, slices))]
    assert placed[0].attribution.seen.name == "alice"
    measured, _ = measure({"GPU-0"}, placed, slices)
    g = measured["alice"]["GPU-0"]
    assert (g.limit_bytes, g.limits_trusted, g.state) == (0, False, OK)
    assert g.as_report()["limits_trusted"] is False
