"""Launch a batch of run configs: in this process, through a pool of local worker processes, or as a Slurm job array.

The launcher's settings live in ``conf/launcher/<name>.yaml``; ``launcher.<key>=<value>`` overrides them.
docs/launchers.md explains the choices and how to pick the settings.

- ``inline``: one run after another in this process (debugging, tests).
- ``local``: a pool of ``max_concurrent`` long-lived worker processes (:func:`run_pool`). Each worker pulls the
  next run from a queue the table process holds, so the load stays balanced to the last run, and serves runs until
  the queue is empty, so the start-up (Python, ``import torch``, the first W&B run) and the reading of each data
  source (:func:`bench.core.data.sharing_sources`) are paid once per worker.
- ``slurm``: submitit's SlurmExecutor; every job is one task of a job array (``array_parallelism`` at once) and
  runs ``runs_per_job`` configs, ``runs_at_once`` of them concurrently (several runs sharing one GPU) through the
  same worker pool.

Each run uses ``cpus_per_task`` torch threads in every launcher, because CPU results depend on the thread count:
with equal thread counts the records are bit-identical across launchers, and whether a worker is fresh or has
already served other runs (every random draw of a run comes from its own seeded generators).

Preemption and time-out: Slurm sends USR2 before killing a job; submitit calls :meth:`RunBatch.checkpoint`,
which requeues the same batch. Finished runs are then reused and the interrupted one resumes from its last
checkpoint (``checkpoint.every_rounds`` / ``every_seconds``), so its records equal an uninterrupted run's.
A run that raises is reported with its log path; the other runs of the batch and of the table go on.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from common.registry import Registry

LAUNCHER_DIR = Path(__file__).resolve().parents[2] / "conf" / "launcher"
LAUNCHERS = Registry("launcher")


@dataclass
class Outcome:
    """What became of one run: ``ok`` or ``failed`` (with the error and where its log is); ``started`` and
    ``ended`` (``time.time()``, 0 when unknown) and the ``worker`` process id that ran it."""

    index: int
    ok: bool
    error: str = ""
    log: str = ""
    started: float = 0.0
    ended: float = 0.0
    worker: int = 0


OnOutcome = Callable[[Outcome], None]


def load_launcher(name: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """``conf/launcher/<name>.yaml`` with ``launcher.<key>=<value>`` overrides; unknown keys are errors."""
    path = LAUNCHER_DIR / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in LAUNCHER_DIR.glob("*.yaml"))
        raise ValueError(f"launcher {name!r} is unknown: use one of {known}")
    cfg = OmegaConf.load(path)
    for item in overrides:
        key, sep, value = item.removeprefix("launcher.").partition("=")
        if not sep:
            raise ValueError(f"launcher override {item!r} is not of the form launcher.<key>=<value>")
        if key.split(".")[0] not in cfg:
            raise ValueError(f"launcher.{key} is not a setting of the {name!r} launcher: it has {sorted(cfg)}")
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([f"{key}={value}"]))
    out: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    out["name"] = name
    optional = {"max_concurrent"} | ({"runs_per_job"} if name == "local" else set())  # null = no cap / no limit
    for key in ("cpus_per_task", "runs_per_job", "max_concurrent", "runs_at_once"):
        if key not in out or (key in optional and out[key] is None):
            continue
        if not isinstance(out[key], int) or isinstance(out[key], bool) or out[key] < 1:
            allowed = "an integer >= 1" + (" or null" if key in optional else "")
            raise ValueError(f"launcher.{key}={out[key]!r} is invalid: it must be {allowed}")
    return out


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask: a container's or Slurm's share, not the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def run_config(index: int, cfg: Mapping[str, Any], reraise: Callable[[], bool] = lambda: False) -> Outcome:
    """Execute one config; an exception becomes a failed outcome (``reraise()`` true: it propagates)."""
    from bench.experiment.run import execute

    started = time.time()
    try:
        execute(cfg)
        return Outcome(index, True, started=started, ended=time.time(), worker=os.getpid())
    except Exception:
        if reraise():
            raise
        return Outcome(index, False, traceback.format_exc(limit=8), started=started, ended=time.time(),
                       worker=os.getpid())


def run_in_turn(configs: Sequence[Mapping[str, Any]], indices: Sequence[int], on_outcome: OnOutcome | None = None,
                reraise: Callable[[], bool] = lambda: False) -> list[Outcome]:
    """Execute the configs one after another in this process (see :func:`run_config` for ``reraise``); each data
    source is read once for all of them."""
    from bench.core.data import sharing_sources

    outcomes = []
    with sharing_sources():
        for index, cfg in zip(indices, configs, strict=True):
            outcomes.append(run_config(index, cfg, reraise))
            if on_outcome is not None:
                on_outcome(outcomes[-1])
    return outcomes


class RunBatch:
    """The callable a job runs: execute each config (finished ones are reused by ``execute``), one after another,
    or ``runs_at_once`` at a time in worker processes of this job (:func:`run_pool`, several runs per GPU)."""

    def __init__(self, configs: Sequence[Mapping[str, Any]], indices: Sequence[int],
                 parent: str | None = None, runs_at_once: int = 1) -> None:
        self.configs = [dict(c) for c in configs]
        self.indices = list(indices)
        self.parent = parent  # local jobs: die with the table process that started them (process_identity)
        self.runs_at_once = runs_at_once
        self._interrupted = False

    def __call__(self, on_outcome: OnOutcome | None = None) -> list[tuple[int, bool, str]]:
        if self.parent is not None:
            follow_parent(self.parent)
        self._interrupted = False
        if self.runs_at_once > 1 and len(self.configs) > 1:  # workers print into this job's log
            outcomes = run_pool(self.configs, self.indices, self.runs_at_once, on_outcome=on_outcome)
        else:  # an exception raised by submitit's signal handler (requeue failed, no time-outs left) ends the job
            outcomes = run_in_turn(self.configs, self.indices, on_outcome, reraise=lambda: self._interrupted)
        return [(o.index, o.ok, o.error) for o in sorted(outcomes, key=lambda o: o.index)]

    def checkpoint(self) -> Any:
        """Called by submitit on preemption or time-out: requeue this batch unchanged."""
        import submitit

        self._interrupted = True
        return submitit.helpers.DelayedSubmission(self)  # __call__ clears the flag when the requeued job starts


def process_identity(pid: int) -> str | None:
    """``pid`` with its start time (so a reused pid is not mistaken for it), or None if it is not running."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f"{pid}:{f.read().rsplit(')', 1)[1].split()[19]}"  # field 22, after the command name
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            return None
        return str(pid)


def follow_parent(parent: str, every: float = 0.5) -> None:
    """End this process (a worker) as soon as ``parent`` (the process that started it, as given by
    :func:`process_identity`) is gone, however it died (even SIGKILL): no orphan keeps computing, or holds a run
    directory's lock, after its table."""
    import threading

    pid = int(parent.split(":")[0])

    def watch() -> None:
        while process_identity(pid) == parent:
            time.sleep(every)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="follow-parent", daemon=True).start()


# ------------------------------------------------------------------------------------------------ worker pool
def run_log(log_dir: Path, cfg: Mapping[str, Any]) -> Path:
    """Where a pool worker writes the output of the run of ``cfg``: named after its run directory."""
    from bench.experiment.identity import run_dir_for

    return log_dir / f"{cfg['method']['name']}--{run_dir_for(cfg).name}.log"


@contextlib.contextmanager
def output_to(path: Path) -> Iterator[None]:
    """This process's stdout and stderr (file descriptors 1 and 2: C libraries' output too) appended to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, old in zip((1, 2), saved, strict=True):
            os.dup2(old, fd)
            os.close(old)


def worker_main(conn: Connection, parent: str | None, log_dir: str | None) -> None:
    """A pool worker: import once, then run each ``(index, config)`` it receives until it receives None."""
    if parent is not None:
        follow_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the pool ends us
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # Slurm's time-out warning: the job process requeues the batch
    logs = Path(log_dir) if log_dir else None
    with output_to(logs / f"worker-{os.getpid()}.log") if logs else contextlib.nullcontext():
        import bench.experiment.run  # noqa: F401 - torch and every method, paid once per worker
        from bench.core.data import sharing_sources

        conn.send(("ready", os.getpid()))
    with sharing_sources():  # a data source is read once per worker, not once per run
        serve(conn, logs)


def serve(conn: Connection, logs: Path | None) -> None:
    """Run each ``(index, config)`` received on ``conn`` until None arrives or the pool is gone."""
    while True:
        try:
            task = conn.recv()
        except EOFError:  # the pool is gone
            return
        if task is None:
            return
        index, cfg = task
        log = run_log(logs, cfg) if logs else None
        with output_to(log) if log else contextlib.nullcontext():
            if log:
                print(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} worker {os.getpid()}: run {index}", flush=True)
            outcome = run_config(index, cfg)
            if not outcome.ok:
                print(outcome.error, file=sys.stderr, flush=True)
        outcome.log = str(log) if log else "(the job's log)"
        conn.send(("done", outcome))


@dataclass
class _Worker:
    process: Any
    conn: Connection
    log: str
    ready: bool = False
    task: tuple[int, dict[str, Any]] | None = None
    since: float = 0.0
    served: int = 0
    timed_out: bool = False


def run_pool(configs: Sequence[Mapping[str, Any]], indices: Sequence[int], workers: int, *,
             log_dir: Path | None = None, runs_per_worker: int | None = None, timeout_s: float | None = None,
             on_outcome: OnOutcome | None = None) -> list[Outcome]:
    """Run ``configs`` in ``workers`` long-lived processes (spawned, so CUDA works in them), each pulling the next
    config when it is free; one outcome per config, in the order they finish.

    Workers start together and get their first run once all are ready. Each run's output goes to
    ``log_dir/<method>--<run dir>.log`` (None: to this process's output). A worker is replaced by a fresh one after
    ``runs_per_worker`` runs (None: never), when its run exceeds ``timeout_s`` (the run fails) and when it dies (its
    run fails with the exit code); the other runs go on. Workers end with this process, however it ends;
    KeyboardInterrupt (Ctrl-C, or SIGTERM turned into it) ends them at once and propagates."""
    ctx = multiprocessing.get_context("spawn")
    todo = deque(zip(indices, (dict(c) for c in configs), strict=True))
    parent = process_identity(os.getpid())
    pool: list[_Worker] = []
    outcomes: list[Outcome] = []
    leaving: list[_Worker] = []
    dead_logs: list[str] = []
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)

    def report(outcome: Outcome) -> None:
        outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)

    def start() -> None:
        here, there = ctx.Pipe()
        process = ctx.Process(target=worker_main, args=(there, parent, str(log_dir) if log_dir else None),
                              name="pflrepro-worker")
        process.start()
        there.close()  # our copy: the worker's end reads EOF only once the worker has gone
        pool.append(_Worker(process, here, str(log_dir / f"worker-{process.pid}.log") if log_dir else "(this output)"))

    def retire(worker: _Worker) -> None:
        """Take ``worker`` out of the pool (it has died, timed out, or been told to stop); its run fails."""
        pool.remove(worker)
        worker.conn.close()
        leaving.append(worker)
        if worker.task is not None:
            worker.process.join(timeout=10)  # it has died or been killed: its exit code says how
            index, cfg = worker.task
            code = worker.process.exitcode
            why = (f"timed out after {timeout_s:.0f} s (launcher.timeout_min)" if worker.timed_out else
                   f"its worker process {worker.process.pid} died (exit code {code}"
                   f"{f', signal {-code}' if code is not None and code < 0 else ''})")
            report(Outcome(index, False, f"the run {why}", str(run_log(log_dir, cfg)) if log_dir else worker.log,
                           worker.since, time.time(), worker.process.pid))
        if not worker.ready:
            dead_logs.append(worker.log)
        elif todo:  # one that never became ready would fail again
            start()

    for _ in range(min(workers, len(todo))):
        start()
    warming = True
    try:
        while todo or any(w.task is not None for w in pool):
            if not pool:  # every worker died on start-up
                while todo:
                    index, _ = todo.popleft()
                    report(Outcome(index, False, "no worker process could start: see " + ", ".join(dead_logs)))
                break
            for conn in wait([w.conn for w in pool], timeout=1.0):
                worker = next(w for w in pool if w.conn is conn)
                try:
                    kind, payload = conn.recv()
                except (EOFError, OSError):
                    retire(worker)
                    continue
                if kind == "ready":
                    worker.ready = True
                    continue
                worker.task, worker.served = None, worker.served + 1
                report(payload)
                if runs_per_worker is not None and worker.served >= runs_per_worker:
                    with contextlib.suppress(OSError):
                        conn.send(None)
                    retire(worker)
            now = time.time()
            for worker in list(pool):
                if timeout_s is not None and worker.task is not None and now - worker.since > timeout_s:
                    worker.timed_out = True
                    worker.process.kill()
                    retire(worker)
            warming = warming and not all(w.ready for w in pool)
            for worker in list(pool):
                if not warming and worker.ready and worker.task is None and todo:
                    try:
                        worker.conn.send(todo[0])
                    except OSError:  # it has just died: its EOF is read next time round
                        continue
                    worker.task, worker.since = todo.popleft(), time.time()
        for worker in pool:
            with contextlib.suppress(OSError):
                worker.conn.send(None)
        leaving += pool
        pool.clear()
        for worker in leaving:
            worker.process.join(timeout=30)  # W&B's service and the interpreter shut down
    except KeyboardInterrupt:
        running = sum(w.task is not None for w in pool)
        print(f"\ninterrupted: {running} running runs cancelled; finished runs are kept and the same command "
              "resumes the rest from their checkpoints", flush=True)
        raise
    finally:
        for worker in pool + leaving:
            if worker.process.is_alive():
                worker.process.kill()
            worker.process.join()
    return outcomes


# ------------------------------------------------------------------------------------------------ launchers
def with_threads(configs: Sequence[Mapping[str, Any]], launcher: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each config with ``threads`` set to the launcher's ``cpus_per_task`` (not part of a run's identity)."""
    return [{**cfg, "threads": int(launcher["cpus_per_task"])} for cfg in configs]


def job_batches(configs: Sequence[Mapping[str, Any]], per_job: int, parent: str | None = None,
                runs_at_once: int = 1) -> list[RunBatch]:
    """The configs cut into consecutive batches of ``per_job`` runs, one per job (``parent``: local jobs end
    with that process; ``runs_at_once``: runs of a batch executing concurrently)."""
    return [RunBatch(configs[i:i + per_job], range(i, min(i + per_job, len(configs))), parent, runs_at_once)
            for i in range(0, len(configs), per_job)]


def launch(configs: Sequence[Mapping[str, Any]], launcher: Mapping[str, Any], log_dir: str | os.PathLike,
           on_outcome: OnOutcome | None = None) -> list[Outcome]:
    """Run every config with ``launcher`` (from :func:`load_launcher`); one outcome per config, in order.
    ``on_outcome`` sees each outcome as soon as it is known (progress display)."""
    configs = with_threads(configs, launcher)
    if not configs:
        return []
    outcomes = LAUNCHERS.get(launcher["name"])(configs, launcher, Path(log_dir), on_outcome)
    return sorted(outcomes, key=lambda o: o.index)


@LAUNCHERS.register("inline")
def _inline(configs: list[dict[str, Any]], launcher: Mapping[str, Any], log_dir: Path,
            on_outcome: OnOutcome | None) -> list[Outcome]:
    def logged_here(outcome: Outcome) -> None:
        outcome.log = "(this process)"
        if on_outcome is not None:
            on_outcome(outcome)

    return run_in_turn(configs, range(len(configs)), logged_here)


@LAUNCHERS.register("local")
def _local(configs: list[dict[str, Any]], launcher: Mapping[str, Any], log_dir: Path,
           on_outcome: OnOutcome | None) -> list[Outcome]:
    workers = launcher.get("max_concurrent") or max(1, usable_cores() // int(launcher["cpus_per_task"]))
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        timeout = launcher.get("timeout_min")
        return run_pool(configs, range(len(configs)), workers, log_dir=log_dir / time.strftime("%Y%m%d-%H%M%S"),
                        runs_per_worker=launcher.get("runs_per_job"), timeout_s=60.0 * timeout if timeout else None,
                        on_outcome=on_outcome)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM / SIGHUP of a table with local workers: cancel them like Ctrl-C does."""
    raise KeyboardInterrupt(f"signal {signum}")


def _collect(job: Any, batch: RunBatch) -> list[Outcome]:
    """Outcomes of a finished submitit job; a job that died without a result fails all its runs."""
    log = f"{job.paths.stdout} / {job.paths.stderr}"
    try:
        return [Outcome(i, ok, err, log) for i, ok, err in job.result()]
    except Exception as err:  # noqa: BLE001 - the job itself failed (killed, out of memory, ...)
        return [Outcome(i, False, f"job {job.job_id} failed: {err!r}"[:2000], log) for i in batch.indices]


#: launcher keys passed to submitit's SlurmExecutor as ``slurm_<key>`` (None = not set)
SLURM_KEYS = ("partition", "account", "qos", "constraint", "exclude", "gres", "gpus_per_node", "gpus_per_task",
              "cpus_per_gpu", "mem_per_gpu", "array_parallelism", "signal_delay_s", "additional_parameters",
              "setup", "comment")


@LAUNCHERS.register("slurm")
def _slurm(configs: list[dict[str, Any]], launcher: Mapping[str, Any], log_dir: Path,
           on_outcome: OnOutcome | None) -> list[Outcome]:
    import submitit

    at_once = min(int(launcher["runs_at_once"]), int(launcher["runs_per_job"]))
    executor = submitit.AutoExecutor(folder=str(log_dir / "%j"), cluster="slurm",
                                     slurm_max_num_timeout=int(launcher["max_num_timeout"]))
    params: dict[str, Any] = {"timeout_min": int(launcher["timeout_min"]), "mem_gb": launcher["mem_gb"],
                              "cpus_per_task": int(launcher["cpus_per_task"]) * at_once, "name": launcher["job_name"]}
    params.update({f"slurm_{k}": launcher[k] for k in SLURM_KEYS if launcher.get(k) not in (None, [], {})})
    executor.update_parameters(**params)
    todo = job_batches(configs, int(launcher["runs_per_job"]), runs_at_once=at_once)
    with executor.batch():  # one job array; each task is a RunBatch (checkpointable, so it is requeued)
        jobs = [executor.submit(batch) for batch in todo]
    print(f"submitted Slurm array {jobs[0].job_id.split('_')[0]} with {len(jobs)} tasks; logs in {log_dir}",
          flush=True)
    outcomes: list[Outcome] = []
    pending = list(zip(jobs, todo, strict=True))
    while pending:
        done = [(job, batch) for job, batch in pending if job.done()]
        for job, batch in done:
            pending.remove((job, batch))
            for outcome in _collect(job, batch):
                outcomes.append(outcome)
                if on_outcome is not None:
                    on_outcome(outcome)
        if pending and not done:
            time.sleep(float(launcher["poll_s"]))
    return outcomes
