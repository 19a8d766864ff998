"""A real Slurm cluster on this machine: Debian's ``slurmctld``, one ``slurmd`` per node, each a
host of its own (``overlay_harness.netns``), with munge for authentication and etcd beside the
controller (Dynamo's discovery backend).

The controller is one more host on the run's bridge: ``slurmctld``, ``etcd`` and every client
command (``sbatch``, ``squeue``, ``scancel``) run there. munged runs on the test's own host; its
socket file, private to the run, is reachable from every namespace. Each daemon runs through
:func:`host_argv`: the host's network namespace entered with ``nsenter`` (``ip netns exec``
remounts ``/sys``, which hides the cgroup mounts slurmd's 22.05 cgroup plugin requires), a UTS
namespace named after the Slurm node, and a mount namespace with the run's hosts file over
``/etc/hosts`` and a ``/dev/shm`` of its own (separate machines share no memory: see
``netns.Host.node_command``). Job steps inherit all three from slurmd. ``SLURM_CONF`` is always
set: without it a client looks the controller up in DNS, off the machine.

Every daemon is this process's child. The run's state directory (config, munge key and socket,
spool, logs, etcd's data) is ``<tmp>/overlay-slurm-<pid>-<run>``; a later run kills what an
aborted run left (the pids recorded there, then anything left in its namespaces) and removes it,
before ``netns`` sweeps the namespaces themselves. Needs root and the Debian packages
``slurm-wlm``, ``munge``, ``etcd-server`` and ``etcd-client`` (``scripts/slurm.py`` installs
them).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path

from sglang_sidecar_overlay.sidecar import proctree

from overlay_harness import netns
from overlay_harness.nodes import wait_for

STATE_PREFIX = "overlay-slurm-"
CONTROLLER = "ctl"
ETCD_PORT = 2379
# The grace Slurm gives a job's processes between SIGTERM and SIGKILL (fault row f's).
KILL_WAIT = 30
DAEMON_DEADLINE = 60.0
STOP_DEADLINE = 20.0
PIDS_FILE = "daemons.json"
# Inside a host: the run's hosts file, a private /dev/shm, the node's name, then the command.
ENTER_HOST = ('mount --bind "$OVERLAY_SLURM_HOSTS" /etc/hosts && '
              "mount -t tmpfs -o mode=1777 tmpfs /dev/shm && "
              'hostname "$0" && exec "$@"')  # fmt: skip
CONFIG = """\
ClusterName=overlay
SlurmctldHost={controller}({controller_address})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={state}/munge/munge.socket.2
CredType=cred/munge
StateSaveLocation={state}/spool/ctld
SlurmctldPidFile={state}/run/slurmctld.pid
SlurmctldLogFile={state}/log/slurmctld.log
SlurmdSpoolDir={state}/spool/slurmd-%n
SlurmdPidFile={state}/run/slurmd-%n.pid
SlurmdLogFile={state}/log/slurmd-%n.log
PlugStackConfig={state}/etc/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
KillWait={kill_wait}
SlurmdTimeout=60
SlurmctldTimeout=60
MessageTimeout=30
InactiveLimit=0
MinJobAge=300
{nodes}
PartitionName=debug Nodes={node_names} Default=YES MaxTime=INFINITE State=UP
"""


def _alive(pid: int, starttime: int) -> bool:
    stat = proctree.read_stat(pid)
    return stat is not None and stat.starttime == starttime and stat.state != "Z"


def _kill_recorded(state: Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        for pid, starttime in json.loads((state / PIDS_FILE).read_text()):
            if _alive(pid, starttime):
                os.kill(pid, signal.SIGKILL)


def _kill_in_netns(name: str) -> None:
    """SIGKILL every process left in network namespace ``name`` (by pid)."""
    proc = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    for pid in proc.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def remove_stale() -> list[str]:
    """Kill what an aborted run left (its recorded daemons, then whatever is left in its
    namespaces) and remove its state directory; ``netns`` removes the namespaces after."""
    removed = []
    for state in Path(tempfile.gettempdir()).glob(f"{STATE_PREFIX}*"):
        owner = state.name[len(STATE_PREFIX) :].split("-")[0]
        if not owner.isdigit() or netns._pid_alive(int(owner)):
            continue
        _kill_recorded(state)
        with contextlib.suppress(OSError, ValueError):
            for name in json.loads((state / "namespaces.json").read_text()):
                _kill_in_netns(name)
        shutil.rmtree(state, ignore_errors=True)
        removed.append(str(state))
    return removed


class Cluster:
    """``nnodes`` Slurm nodes ``n0``, ``n1``, ... and the controller ``ctl`` on a private
    bridge, with munge and etcd; started by :meth:`start`, removed by :meth:`stop`."""

    def __init__(self, nnodes: int) -> None:
        self.state = (
            Path(tempfile.gettempdir()) / f"{STATE_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        self.node_names = [f"n{index}" for index in range(nnodes)]
        self.network = netns.Network(nnodes + 1)
        self.hosts = dict(zip([*self.node_names, CONTROLLER], self.network.hosts, strict=True))
        self.daemons: dict[str, subprocess.Popen] = {}

    @property
    def controller(self) -> netns.Host:
        return self.hosts[CONTROLLER]

    @property
    def etcd_endpoint(self) -> str:
        return f"http://{self.controller.address}:{ETCD_PORT}"

    def node_host(self, name: str) -> netns.Host:
        return self.hosts[name]

    # --- commands -------------------------------------------------------------------------

    def environ(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with what every Slurm command here
        needs: the run's config and hosts file."""
        return dict(os.environ if base is None else base,
                    SLURM_CONF=str(self.state / "etc" / "slurm.conf"),
                    OVERLAY_SLURM_HOSTS=str(self.state / "etc" / "hosts"))  # fmt: skip

    def host_argv(self, name: str, argv: list[str]) -> list[str]:
        """``argv`` run as host ``name`` (a node or the controller), as its daemons run."""
        return ["nsenter", f"--net=/run/netns/{self.hosts[name].netns}", "unshare", "--uts",
                "--mount", "--", "sh", "-c", ENTER_HOST, name, *argv]  # fmt: skip

    def client(
        self,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess:
        """A Slurm client command (``sbatch``, ``squeue``, ...) on the controller's host, in
        ``env`` (default: this process's environment)."""
        proc = subprocess.run(self.host_argv(CONTROLLER, argv), capture_output=True, text=True,
                              env=self.environ(env), timeout=timeout,
                              stdin=subprocess.DEVNULL)  # fmt: skip
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
        return proc

    # --- lifetime -------------------------------------------------------------------------

    def start(self) -> None:
        remove_stale()
        self._write_files()
        self.network.acquire()
        try:
            self._start_daemons()
        except BaseException:
            self.stop()
            raise

    def _write_files(self) -> None:
        state = self.state
        for sub in ("etc", "log", "run", "spool/ctld", "jobs", "etcd", "munge-key", "munge",
                    *(f"spool/slurmd-{name}" for name in self.node_names)):  # fmt: skip
            (state / sub).mkdir(parents=True, exist_ok=True)
        # munged: its socket's directory open to all, its key's private.
        (state / "munge").chmod(0o755)
        (state / "munge-key").chmod(0o700)
        (state / "namespaces.json").write_text(json.dumps([h.netns for h in self.hosts.values()]))
        hosts = "".join(f"{host.address} {name}\n" for name, host in self.hosts.items())
        (state / "etc" / "hosts").write_text(f"127.0.0.1 localhost\n{hosts}")
        (state / "etc" / "plugstack.conf").write_text("")
        nodes = "\n".join(
            f"NodeName={name} NodeAddr={self.hosts[name].address} NodeHostname={name} CPUs="
            f"{os.cpu_count()} RealMemory=1000 State=UNKNOWN"
            for name in self.node_names
        )
        (state / "etc" / "slurm.conf").write_text(CONFIG.format(
            controller=CONTROLLER, controller_address=self.controller.address, state=state,
            kill_wait=KILL_WAIT, nodes=nodes, node_names=",".join(self.node_names),
        ))  # fmt: skip

    def _daemon(self, name: str, argv: list[str]) -> None:
        with open(self.state / "log" / f"{name}.out", "wb") as out:
            self.daemons[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                                  stderr=subprocess.STDOUT, env=self.environ(),
                                                  start_new_session=True)  # fmt: skip
        recorded = [(p.pid, proctree.read_stat(p.pid).starttime) for p in self.daemons.values()
                    if proctree.read_stat(p.pid) is not None]  # fmt: skip
        (self.state / PIDS_FILE).write_text(json.dumps(recorded))

    def _start_daemons(self) -> None:
        state = self.state
        key = state / "munge-key" / "munge.key"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True,
                       capture_output=True)  # fmt: skip
        self._daemon("munged", ["munged", "-F", f"--socket={state}/munge/munge.socket.2",
                                f"--key-file={key}", f"--log-file={state}/log/munged.log",
                                f"--pid-file={state}/run/munged.pid",
                                f"--seed-file={state}/munge-key/munged.seed"])  # fmt: skip
        wait_for(lambda: (state / "munge" / "munge.socket.2").exists(), DAEMON_DEADLINE,
                 "munged's socket")  # fmt: skip
        address = self.controller.address
        self._daemon("etcd", self.host_argv(CONTROLLER, [
            "etcd", "--name", CONTROLLER, "--data-dir", str(state / "etcd"),
            "--listen-client-urls", self.etcd_endpoint,
            "--advertise-client-urls", self.etcd_endpoint,
            "--listen-peer-urls", f"http://{address}:{ETCD_PORT + 1}",
            "--initial-advertise-peer-urls", f"http://{address}:{ETCD_PORT + 1}",
            "--initial-cluster", f"{CONTROLLER}=http://{address}:{ETCD_PORT + 1}",
        ]))  # fmt: skip
        self._daemon("slurmctld", self.host_argv(CONTROLLER, ["slurmctld", "-D", "-i"]))
        wait_for(lambda: "is UP" in self.client(["scontrol", "ping"], check=False).stdout,
                 DAEMON_DEADLINE, "slurmctld to answer")  # fmt: skip
        for name in self.node_names:
            self._daemon(f"slurmd-{name}", self.host_argv(name, ["slurmd", "-D", "-N", name]))
        wait_for(self._nodes_idle, DAEMON_DEADLINE, f"nodes {self.node_names} idle")
        wait_for(self._etcd_healthy, DAEMON_DEADLINE, "etcd to answer")

    def _nodes_idle(self) -> bool:
        for daemon, proc in self.daemons.items():
            if proc.poll() is not None:
                log = self.state / "log" / f"{daemon}.out"
                raise AssertionError(f"{daemon} exited {proc.returncode}: "
                                     f"{log.read_text(errors='replace')[-2000:]}")  # fmt: skip
        out = self.client(["sinfo", "-h", "-N", "-o", "%N:%T"], check=False).stdout.split()
        return sorted(out) == [f"{name}:idle" for name in self.node_names]

    def _etcd_healthy(self) -> bool:
        return self.client(["etcdctl", "--endpoints", self.etcd_endpoint, "endpoint", "health"],
                           check=False).returncode == 0  # fmt: skip

    def queued(self, job: str | None = None) -> bool:
        """Whether Slurm still lists ``job`` (any job when None)."""
        which = ["-j", job] if job is not None else []
        return bool(self.client(["squeue", "-h", *which], check=False).stdout.strip())

    def daemon_pids(self) -> list[int]:
        """The daemons' processes (their wrappers exec into them)."""
        return [proc.pid for proc in self.daemons.values() if proc.poll() is None]

    def stop(self) -> None:
        """Cancel every job, stop the daemons, kill anything left in the hosts, and remove the
        hosts and the state directory."""
        if "slurmctld" in self.daemons:
            self.client(["scancel", "--user=root"], check=False)
            with contextlib.suppress(AssertionError):
                wait_for(lambda: not self.queued(), KILL_WAIT + 15, "every job to end")
        for proc in reversed(self.daemons.values()):
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        for proc in self.daemons.values():
            try:
                proc.wait(timeout=STOP_DEADLINE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_DEADLINE)
        self.daemons.clear()
        for host in self.hosts.values():
            _kill_in_netns(host.netns)
        self.network.release()
        shutil.rmtree(self.state, ignore_errors=True)

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
