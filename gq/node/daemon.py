"""gqnode: registers with gqd, heartbeats, launches shepherds, and reports every run's end.

Every run has a directory `jobs/JOBID.RESTART/` (launch order; its record: shepherd and job pids,
final status), and every report goes through the durable outbox, so a restarted gqnode re-adopts
live shepherds and still reports runs that ended while it was down.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from gq import defaults, keys, protocol, schema, service
from gq.errors import GqError
from gq.fsutil import private_dir
from gq.messages import (
    FINISHED, MAX_NOTE, STARTED, Ack, Alive, HeadMessage, Heartbeat, Kill, Launch, Mark,
    Message, Register, Report, Reregister, Step, StepKill, usage_fields)
from gq.model import JobState
from gq.node import disk, lease, shepherd, trash
from gq.node.cache import WarmCache
from gq.node.gpus import GpuSource
from gq.node.health import HealthCheck
from gq.node.isolation import NodeIsolation
from gq.node.outbox import Outbox
from gq.node.runfiles import RunOrder, read_order, stop_reason, write_order
from gq.node.runfiles import alive as _alive
from gq.node.runfiles import proc_start as _proc_start
from gq.node.steps import NodeSteps
from gq.relay import Forwarder

log = logging.getLogger("gq.node")

#: Adopted shepherds (not our children, so no SIGCHLD) are checked this often, in seconds.
ADOPTED_CHECK_S = 1.0


@dataclass
class Run:
    job_id: int
    restart: int
    dir: Path
    pid: int
    #: Start time of the shepherd process, so a recycled pid is never mistaken for it.
    pid_started: float
    child: bool
    #: Its job's GQ_CHECKPOINT_DIR (None: not looked up yet; "": unknown).
    checkpoint_dir: str | None = None


class NodeDaemon:
    def __init__(self, name: str, head: str, state_dir: Path, gpus: GpuSource,
                 cpus: int, mem: int, addr: str, heartbeat_s: float,
                 curve: keys.CurveKeys | None = None, health: HealthCheck | None = None,
                 ctx: zmq.Context | None = None, signals: service.Signals | None = None,
                 isolation: NodeIsolation | None = None, relay: str = "",
                 features: list[str] | None = None, head_lease_s: float = 0.0,
                 cache: WarmCache | None = None):
        self.name, self.head_addr, self.addr = name, head, addr
        #: Its features (--features, [node] features), which jobs' --constraint names.
        self.features = list(features or [])
        self.health = health
        #: Why launches fail here, sent as a health problem (the node gets drained); "" if none.
        self.launch_problem = ""
        self.state_dir = state_dir
        self.jobs_dir = state_dir / "jobs"
        # 0711: no one else lists them, but a job's owner reaches its run directory (0700, theirs)
        # to execute the script there.
        private_dir(state_dir, 0o711)
        private_dir(self.jobs_dir, 0o711)
        self.gpu_source = gpus
        self.gpus = gpus.discover()
        #: The cache keys warm on each GPU (model affinity), sent with each heartbeat.
        self.cache = cache or WarmCache(defaults.CACHE_KEYS_PER_GPU)
        # Its LRUs are sized by each GPU's memory (the jobs' --gpu-mem against it).
        self.cache.vram = {g.index: g.memory for g in self.gpus}
        self.cpus, self.mem = cpus, mem
        self.heartbeat_s = heartbeat_s
        #: [node] head_lease_s: without a word from gqd for that long, the jobs here stop.
        self.lease = lease.HeadLease(head_lease_s, state_dir / lease.FILE, time.monotonic())
        #: Runs stopped because the lease ran out (each is stopped once).
        self.lease_stopped: set[tuple[int, int]] = set()
        self.outbox = Outbox(state_dir / "outbox")
        self.disk = disk.StateDisk(state_dir)
        self.runs: dict[tuple[int, int], Run] = {}
        #: The job steps (srun) running here.
        self.steps = NodeSteps(name, state_dir, self.outbox)
        #: Each run's cgroup, CPUs, device rules and /tmp; none without cgroups.
        self.isolation = isolation or NodeIsolation(None, state_dir)
        # `gqnode --virtual` gives all its identities one context and one set of signal flags.
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        # NAME/random: gqd routes by it, and a random part no other peer can guess means no
        # one can take over this node's connection (gqd checks NAME against our key).
        self.sock.setsockopt(zmq.IDENTITY, f"{name}/{os.urandom(8).hex()}".encode())
        self.sock.linger = 0
        self.sock.maxmsgsize = defaults.MAX_MESSAGE_BYTES
        if curve is not None:
            self.sock.curve_secretkey = curve.secret
            self.sock.curve_publickey = curve.public
            self.sock.curve_serverkey = curve.server
        self.sock.connect(head)
        #: The socket on which the jobs here reach gqd, through this node (their GQ_ENDPOINT),
        #: when [relay] head names gqd's relay endpoint; one per process (its ZAP handler).
        self.relay = Forwarder(self.ctx, f"ipc://{state_dir / defaults.NODE_RELAY_SOCKET}",
                               relay, curve, f"node {name}'s relay") \
            if relay and curve is not None and self._own_ctx else None
        self.signals = signals or service.Signals()
        self.signals.watch_children()
        self._next_heartbeat = 0.0
        self._next_adopted_check = 0.0

    # ------------------------------------------------------------ start-up

    def adopt(self) -> None:
        """Pick up runs from the state directory: live shepherds and unreported ends."""
        reported = set(self._unacked_ends())
        for run_dir in sorted(self.jobs_dir.iterdir()):
            try:
                job_id, restart = (int(x) for x in run_dir.name.split("."))
            except ValueError:
                continue
            if (job_id, restart) in reported:
                continue  # its end is in the outbox; the directory goes when that is acked
            pid, pid_started = shepherd.read_pid(run_dir, "shepherd", shepherd.PID_FILE)
            run = Run(job_id, restart, run_dir, pid, pid_started, child=False)
            self.runs[(job_id, restart)] = run
            if not _alive(pid, pid_started):
                self._ended(run)
            else:
                self.isolation.adopted((job_id, restart), run_dir)
        self.isolation.sweep(set(self.runs))  # cgroups and /tmp of runs that are gone
        self.steps.adopt()
        log.info("adopted %d running jobs; %d reports waiting", len(self.runs), len(self.outbox))

    def register(self) -> None:
        """Tell the head what this node has, runs it still holds included (their ends too)."""
        self._send(Register(
            node=self.name, addr=self.addr, cpus=self.cpus, mem=self.mem,
            gpu_source=self.gpu_source.kind, features=tuple(self.features), gpus=tuple(self.gpus),
            running=tuple((r.job_id, r.restart) for r in self.runs.values())
            + tuple(self._unacked_ends()), head_lease_s=self.lease.lease_s))

    def _unacked_ends(self) -> list[tuple[int, int]]:
        """(job_id, restart) of the runs whose end the outbox holds, not yet acked."""
        return [(e.job_id, e.restart) for e in self.outbox.entries() if e.event == FINISHED]

    # ------------------------------------------------------------ the loop

    def start(self) -> None:
        self.adopt()
        self.register()

    def run(self) -> int:
        self.start()
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.signals.wake_r, zmq.POLLIN)
        for sock in self.relay.sockets() if self.relay else []:
            poller.register(sock, zmq.POLLIN)
        service.notify("READY=1")
        log.info("gqnode %s up: %d GPUs (%s), head %s", self.name, len(self.gpus),
                 self.gpu_source.kind, self.head_addr)
        while True:
            timeout = max(0.0, self.due() - time.monotonic())
            events = dict(poller.poll(int(timeout * 1000) + 1))
            self.signals.drain()
            if self.signals.stop_requests:
                # Jobs are never killed by a daemon stop: their shepherds outlive us.
                log.info("stop signal: gqnode stops; %d jobs keep running", len(self.runs))
                return 0
            if self.signals.child_exited:
                self.signals.child_exited = False
                for pid, status in reap_children():
                    self.reaped(pid, status)
            self.step(self.sock in events)
            if self.relay:
                self.relay.serve(events)

    def due(self) -> float:
        """When the loop next has a timer to serve (time.monotonic() seconds: every timer of
        gqnode's counts on the monotonic clock, so a step of the wall clock neither silences its
        heartbeats nor holds back its reports)."""
        until = self.lease.until if set(self.runs) - self.lease_stopped else math.inf
        return min(self._next_heartbeat, self._next_adopted_check, until,
                   self.health.due() if self.health else math.inf)

    def step(self, readable: bool) -> None:
        """One turn of the loop after a wake: messages in, timers, reports out."""
        if readable:
            self._receive()
        now = time.monotonic()
        if self.health and self.health.poll(now):
            self._next_heartbeat = now  # tell gqd at once
        if now >= self._next_adopted_check:
            self._next_adopted_check = now + ADOPTED_CHECK_S
            self._check_adopted()
            self.steps.check_adopted()
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self.heartbeat_s
            self.disk.check(writes_ok=not self.outbox.unwritten)
            self._heartbeat()
        if self.lease.expired(now) and set(self.runs) - self.lease_stopped:
            self._lease_expired()
        self._flush_outbox(now)

    def _receive(self) -> None:
        for _ in range(defaults.MAX_BATCH):
            try:
                frame = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self._handle(protocol.from_head(frame))
            except GqError as exc:
                log.warning("dropping message from head: %s", exc)

    def _handle(self, msg: HeadMessage) -> None:
        if isinstance(msg, Launch):
            self.launch(msg)
        elif isinstance(msg, Kill):
            self.kill(msg)
        elif isinstance(msg, Ack):
            entry = self.outbox.ack(msg.seq)
            if entry and entry.event == FINISHED:
                trash.remove(self.jobs_dir / f"{entry.job_id}.{entry.restart}")
            elif entry:
                self.steps.acked(entry)
        elif isinstance(msg, Reregister):
            self.register()
            self._next_heartbeat = 0.0  # under a lease, its answer renews the lease at once
        elif isinstance(msg, Alive):
            if self.lease.answered(msg.beat) and self.lease_stopped:
                log.info("gqd answers again: the head lease is renewed")
        elif isinstance(msg, Step):
            run = self.runs.get((msg.job_id, msg.restart))
            self.steps.start(msg, run.dir if run else None)
        elif isinstance(msg, StepKill):
            self.steps.kill(msg.job_id, msg.restart, msg.step, msg.signal)

    # ------------------------------------------------------------ runs

    def launch(self, msg: Launch) -> None:
        try:
            self._launch(msg)
        except OSError as exc:
            # This node cannot start jobs (a full or broken disk, no more processes): a node
            # fault. gqd requeues the job (within its --retries) and drains the node: a full
            # disk until it has room again (its other jobs go on), anything else until gqnode
            # restarts (its heartbeats say so).
            shutil.rmtree(self.jobs_dir / f".{msg.job_id}.{msg.restart}.tmp",
                          ignore_errors=True)
            problem = f"gqnode cannot launch jobs: {exc}"
            if not self.disk.failed(exc):
                self.launch_problem = problem
            log.error("job %d run %d: %s", msg.job_id, msg.restart, problem)
            self.isolation.forget((msg.job_id, msg.restart))
            self._next_heartbeat = 0.0
            self._report(msg.job_id, msg.restart, FINISHED, time.time(),
                         state=JobState.NODE_FAIL.value, note=problem)

    def _launch(self, msg: Launch) -> None:
        key = (msg.job_id, msg.restart)
        run_dir = self.jobs_dir / f"{key[0]}.{key[1]}"
        if key in self.runs or run_dir.exists():
            return  # a resent launch: this run already started here
        tmp = self.jobs_dir / f".{run_dir.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(mode=0o700)
        # Room for the record's lines (the final status above all) even if the disk fills up.
        disk.reserve(tmp / shepherd.RECORD_FILE, defaults.RUN_RECORD_RESERVE_BYTES)
        # Neither the order nor the shepherd's pid needs an fsync: both only matter while this
        # boot's shepherd lives (a host crash kills it, and adopt() then reports the run lost
        # either way). The order needs no atomic write either: its directory is renamed whole.
        # With it, how the run is confined (gq.node.isolation), for its shepherd and for us,
        # and the relay the job's gq commands go through (shepherd: GQ_ENDPOINT).
        write_order(tmp / shepherd.LAUNCH_FILE, RunOrder(
            msg, self.isolation.plan(msg), self.relay.endpoint if self.relay else "",
            cache_warm=self.cache.launch(msg.gpus, msg.spec.cache_key, msg.spec.gpu_mem)))
        os.rename(tmp, run_dir)  # the run exists (for adoption) only once its order is whole
        pid = shepherd.spawn(run_dir)
        started = _proc_start(pid)
        try:
            shepherd.record(run_dir, "shepherd", f"{pid} {started}")
        except OSError as exc:
            # The run goes on; only a restarted gqnode would not find it (and report it lost).
            log.warning("job %d run %d: cannot record its shepherd's pid: %s", key[0], key[1],
                        exc)
        self.runs[key] = Run(key[0], key[1], run_dir, pid, started, child=True)
        self._report(key[0], key[1], STARTED, time.time())
        log.info("job %d run %d started (shepherd %d, GPUs %s)", key[0], key[1], pid,
                 list(msg.gpus))

    def _lease_expired(self) -> None:
        """Nothing from gqd for head_lease_s: gqd may be about to run these jobs elsewhere, so
        they stop here, as a cancel stops them (SIGTERM, the grace, SIGKILL), and end NODE_FAIL
        (requeued, if gqd has not already) when the head hears of them again."""
        reason = lease.EXPIRED.format(lease=self.lease.lease_s)
        for run in list(self.runs.values()):
            key = (run.job_id, run.restart)
            if key not in self.lease_stopped:
                log.warning("job %d run %d: %s; stopping it", run.job_id, run.restart, reason)
                self.lease_stopped.add(key)
                self.kill(Kill(run.job_id, run.restart, "TERM"), reason=reason)

    def kill(self, msg: Kill, reason: str = "") -> None:
        """Pass a KILL on to the run's shepherd: SIGUSR1 to kill at once; else the stop order
        (which signal, to whom, how much grace; `reason`: why gqnode itself stops it) into the
        run's directory, then SIGTERM."""
        run = self.runs.get((msg.job_id, msg.restart))
        if run is None:
            return
        sig = msg.signal
        no_kill = msg.no_kill and sig != "KILL"
        if not msg.batch_only:  # the job's steps here get its signal (and end with it)
            self.steps.kill(run.job_id, run.restart, sig=sig, grace_s=msg.grace_s,
                            no_kill=no_kill)
        if sig != "KILL":
            try:
                shepherd.order_stop(run.dir, sig, msg.batch_only, msg.grace_s, no_kill=no_kill,
                                    reason=reason)
            except OSError as exc:
                if no_kill:  # a SIGTERM without the order would stop the job: send nothing
                    log.warning("job %d run %d: cannot write its signal order (%s): not sent",
                                run.job_id, run.restart, exc)
                    return
                log.warning("job %d run %d: cannot write its stop order (%s): it gets SIGTERM",
                            run.job_id, run.restart, exc)
        with contextlib.suppress(ProcessLookupError):
            os.kill(run.pid, signal.SIGUSR1 if sig == "KILL" else signal.SIGTERM)

    def reaped(self, pid: int, status: int) -> bool:
        """A child of this process ended: True if it was this node's (a run or a health check
        whose verdict changed), which then has news for gqd."""
        news = False
        if self.health and self.health.reaped(pid, status, time.monotonic()):
            self._next_heartbeat = 0.0  # tell gqd at once
            news = True
        for run in list(self.runs.values()):
            if run.pid == pid:
                self._ended(run)
                news = True
        return self.steps.reaped(pid) or news

    def _check_adopted(self) -> None:
        for run in list(self.runs.values()):
            if not run.child and not _alive(run.pid, run.pid_started):
                self._ended(run)

    def _ended(self, run: Run) -> None:
        """The shepherd is gone: queue its final status and forget the run. Until the report
        is committed the run's directory (with the status the shepherd wrote durably) stands for
        it: adopt() reports a run again unless the outbox holds its end."""
        status = shepherd.read_status(run.dir)
        # Its CPUs are free; what a dead shepherd left in the job's cgroup is killed.
        used, left = self.isolation.ended((run.job_id, run.restart), run.dir, status is None)
        if status is None:
            # The shepherd was killed (the host rebooted, the OOM killer): a node fault, not the
            # job's, so gqd requeues it (within its --retries). Nothing may go on running it.
            killed = shepherd.kill_orphaned_job(run.dir) or left
            status = {"state": JobState.NODE_FAIL.value, "exit_code": None,
                      "end_time": time.time(),
                      "note": "its shepherd died without writing a status (node rebooted?)"
                      + ("; its leftover processes were killed" if killed else "")}
            if used is not None:
                status.update(max_rss=used.max_rss, cpu_s=used.cpu_s)
        reason = stop_reason(run.dir)
        if reason and status["state"] == JobState.CANCELLED.value:
            # gqnode stopped it (its head lease ran out): a node fault, not the job's end.
            status.update(state=JobState.NODE_FAIL.value, note=reason)
        if status.get("setup_error") and not self.launch_problem:
            # The node cannot confine jobs (its cgroups, a mount): drained, as for a launch.
            self.launch_problem = f"gqnode cannot launch jobs: {status.get('note')}"
            self._next_heartbeat = 0.0
        self._report(run.job_id, run.restart, FINISHED, status["end_time"],
                     state=status["state"], exit_code=status["exit_code"],
                     note=str(status.get("note") or "")[:MAX_NOTE], **usage_fields(status))
        if status.get("note"):
            log.warning("job %d run %d: %s", run.job_id, run.restart, status["note"])
        self.runs.pop((run.job_id, run.restart), None)
        self.lease_stopped.discard((run.job_id, run.restart))
        self.steps.kill(run.job_id, run.restart, sig="KILL")  # nothing of it outlives it here
        log.info("job %d run %d ended %s (exit %s)", run.job_id, run.restart, status["state"],
                 status["exit_code"])

    # ------------------------------------------------------------ messages out

    def _heartbeat(self) -> None:
        # health: faults that make results suspect (gqd drains the node and requeues its jobs);
        # disk: a full state disk (gqd drains it until the problem is gone; its jobs go on).
        self._send(Heartbeat(
            node=self.name,
            telemetry={str(k): v for k, v in self.gpu_source.telemetry().items()},
            health=tuple(self.gpu_source.health())
            + ((self.health.problem,) if self.health and self.health.problem else ())
            + ((self.launch_problem,) if self.launch_problem else ()),
            disk=self.disk.problem, beat=self.lease.beat(time.monotonic()),
            checkpoints=self._checkpoints(),
            warm=self.cache.report(g.index for g in self.gpus)))

    def _checkpoints(self) -> tuple[Mark, ...]:
        """Each run's checkpoint marker that exists (its mtime), every beat: gqd keeps each
        run's latest and ignores a marker older than the run (an earlier run's)."""
        out = []
        for run in self.runs.values():
            if run.checkpoint_dir is None:
                try:  # where its shepherd put GQ_CHECKPOINT_DIR, worked out the same way
                    run.checkpoint_dir = shepherd.job_env(read_order(run.dir))[
                        "GQ_CHECKPOINT_DIR"]
                except (OSError, ValueError, KeyError) as exc:
                    log.warning("job %d run %d: no checkpoint directory: %s", run.job_id,
                                run.restart, exc)
                    run.checkpoint_dir = ""
            try:  # lstat: the marker's own time, not that of what a link points to
                mtime = os.lstat(os.path.join(run.checkpoint_dir, defaults.CHECKPOINT_MARKER)
                                 ).st_mtime
            except (OSError, ValueError):
                continue  # none yet (or the directory is out of this node's reach)
            out.append(Mark(job_id=run.job_id, restart=run.restart, time=mtime))
        return tuple(out[:schema.COUNTS["checkpoints"]])

    def _report(self, job_id: int, restart: int, event: str, when: float, **end: Any) -> None:
        """Put a run's report in the outbox (which gives it its seq): the outbox keeps it on
        disk until gqd acks it. `end`: a finished run's Report fields."""
        self.outbox.put(Report(node=self.name, seq=0, job_id=job_id, restart=restart,
                               event=event, time=when, **end))

    def _flush_outbox(self, now: float) -> None:
        held = self.outbox.unwritten
        try:
            self.outbox.commit()  # this turn's reports, in one durable write
        except OSError as exc:
            # Sent all the same, from memory, and written by a later turn. A full disk drains
            # the node and nothing more; another failure is a broken disk, a node fault.
            if not held:
                log.warning("cannot write the outbox (%s): its reports are sent from memory "
                            "until it can", exc)
            had = self.disk.problem
            if self.disk.failed(exc):
                if not had:
                    self._next_heartbeat = 0.0
            elif not self.launch_problem:
                self.launch_problem = f"gqnode cannot write its outbox: {exc}"
                log.error("%s", self.launch_problem)
                self._next_heartbeat = 0.0
        for report in self.outbox.due(now, defaults.OUTBOX_RESEND_S):
            self._send(report)

    def _send(self, msg: Message) -> None:
        try:
            self.sock.send(protocol.encode_message(msg), zmq.NOBLOCK)
        except zmq.Again:
            pass  # not connected yet: heartbeats repeat and reports are resent from the outbox

    def close(self) -> None:
        trash.flush()
        # A shepherd forked just before the stop may not have made its run's cgroup yet: the
        # node's directories it goes into stay while any run is live (they would be empty).
        self.isolation.close(runs_live=bool(self.runs))
        if self.relay:
            self.relay.close()
        self.sock.close()
        if self._own_ctx:
            self.ctx.term()
        self.gpu_source.close()


def reap_children() -> Iterator[tuple[int, int]]:
    """(pid, wait status) of every child of this process that has ended, reaping them."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status

