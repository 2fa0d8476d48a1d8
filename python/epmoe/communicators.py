"""Where an EP group's ranks talk: epmoe.Communicator, one rank's end.

* ``mpi_communicator(comm)``: this process's rank of an mpi4py communicator
  (under ``mpirun -np R python ...``); mpi4py is imported here, lazily, and
  must be the MPI epmoe was built with (Debian's python3-mpi4py and
  libopenmpi are).
* ``ThreadsWorld(R).communicator(r)``: R ranks as threads of this process,
  for tests and single-machine use; ``run_threads(R, fn)`` runs fn(comm) on
  one Python thread per rank and re-raises a rank's error.

A rank that fails must not leave the others waiting for it until their
timeout (60 s by default): run_threads aborts the world when fn raises, and
mpi_communicator installs a sys.excepthook and a threading.excepthook
(each chained to the previous one) that, after the usual traceback, print
"epmoe: rank R: failed: <error>" and call MPI_Abort, which ends every rank
of the job at once: an uncaught error in any thread of a rank, not only its
main thread (a worker thread that dies leaves its rank's steps unfinished
as surely). It also
registers an atexit handler that ends every epmoe object on MPI (steps,
layers, groups, communicators, newest first) before mpi4py finalises MPI.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import weakref

from . import _epmoe

Communicator = _epmoe.Communicator
ThreadsWorld = _epmoe.ThreadsWorld

__all__ = ["Communicator", "ThreadsWorld", "run_threads", "mpi_communicator", "set_compute_threads"]


def set_compute_threads(num_threads: int) -> None:
    """The compute threads (OpenMP) of epmoe's calls made by the calling thread."""
    _epmoe.set_compute_threads(num_threads)


def run_threads(num_ranks: int, fn, compute_threads_per_rank: int = 0) -> list:
    """fn(communicator) on num_ranks Python threads of one ThreadsWorld, one
    per rank; returns their results in rank order.

    When fn raises on a rank, the world is aborted ("rank r failed: ..."), so
    the other ranks' waits end at once with an epmoe.AbortedError, and once
    every rank has ended the root error is raised here (not an AbortedError
    when a real error exists). Each rank computes on compute_threads_per_rank
    threads, or max(1, cores // num_ranks) when 0, as `epmoe layer` does."""
    world = ThreadsWorld(num_ranks)
    threads_per_rank = compute_threads_per_rank or max(1, (os.cpu_count() or 1) // num_ranks)
    results = [None] * num_ranks
    errors: list[BaseException | None] = [None] * num_ranks

    def rank_main(rank):
        communicator = world.communicator(rank)
        try:
            _epmoe.set_compute_threads(threads_per_rank)
            results[rank] = fn(communicator)
        except BaseException as error:  # noqa: B036 - every failure must wake the other ranks
            errors[rank] = error
            communicator.abort(f"rank {rank} failed: {type(error).__name__}: {error}")

    threads = [threading.Thread(target=rank_main, args=(rank,), name=f"epmoe rank {rank}")
               for rank in range(num_ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failed = [error for error in errors if error is not None]
    if failed:
        roots = [error for error in failed if not isinstance(error, _epmoe.AbortedError)]
        raise (roots or failed)[0]
    return results


# The MPI communicators made so far (weakly: a closed or collected one
# drops out), for the excepthook.
_mpi_communicators: weakref.WeakSet = weakref.WeakSet()
_exit_handlers_installed = False


def _abort_every_rank(exc_type, exc, where):
    for communicator in list(_mpi_communicators):
        try:
            # Prints "epmoe: rank R: <reason>" and calls MPI_Abort: never returns.
            communicator.abort(f"failed: {exc_type.__name__}: {exc} (an uncaught Python exception{where}; "
                               "MPI_Abort ends every rank)")
        except Exception:  # closed at exit already: try the next one
            continue


def _abort_on_uncaught(previous_hook):
    def hook(exc_type, exc, traceback):
        previous_hook(exc_type, exc, traceback)
        _abort_every_rank(exc_type, exc, "")
    return hook


def _abort_on_uncaught_in_thread(previous_hook):
    def hook(args):
        previous_hook(args)
        if args.exc_type is SystemExit:  # a thread's normal way to end early, as the default hook reads it
            return
        name = args.thread.name if args.thread is not None else "a thread"
        _abort_every_rank(args.exc_type, args.exc_value, f" in thread {name!r}")
    return hook


def _install_exit_handlers():
    global _exit_handlers_installed
    if _exit_handlers_installed:
        return
    _exit_handlers_installed = True
    sys.excepthook = _abort_on_uncaught(sys.excepthook)
    threading.excepthook = _abort_on_uncaught_in_thread(threading.excepthook)
    # After mpi4py's import, so it runs before mpi4py's finalisation (atexit
    # runs newest first, and mpi4py finalises in Py_AtExit, later still).
    atexit.register(_epmoe._close_mpi_objects)


def mpi_communicator(comm=None) -> Communicator:
    """This process's rank of `comm` (an mpi4py communicator; default
    MPI.COMM_WORLD) as an epmoe.Communicator. Collective: every process of
    comm calls it. epmoe's messages travel on a duplicate of comm, so they
    never meet the caller's own.

    Needs MPI initialised with MPI_THREAD_MULTIPLE (mpi4py's default:
    mpi4py.rc.thread_level = "multiple") and mpi4py on the same MPI library
    as epmoe. ValueError otherwise, saying which and what to do."""
    if not _epmoe.has_mpi:
        raise RuntimeError("mpi_communicator: this epmoe was built without MPI (EPMOE_WITH_MPI=OFF or no MPI found)")
    from mpi4py import MPI  # lazily: `import epmoe` never imports mpi4py

    if comm is None:
        comm = MPI.COMM_WORLD
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"mpi_communicator: comm must be an mpi4py communicator, got {type(comm).__name__}")
    theirs, ours = MPI.Get_library_version().strip(), _epmoe.mpi_library_version().strip()
    if theirs.splitlines()[0] != ours.splitlines()[0]:
        raise ValueError(f"mpi_communicator: mpi4py runs on {theirs.splitlines()[0]!r} but epmoe was built with "
                         f"{ours.splitlines()[0]!r}; install an mpi4py built against epmoe's MPI (on Debian: "
                         "apt-get install python3-mpi4py)")
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        raise ValueError("mpi_communicator: MPI was initialised without MPI_THREAD_MULTIPLE, which epmoe's "
                         "collectives need (they post messages from progress threads); leave "
                         "mpi4py.rc.thread_level at its default 'multiple' before `from mpi4py import MPI`")
    handle = comm.handle if hasattr(comm, "handle") else MPI._handleof(comm)  # mpi4py >= 4, and 3.x
    communicator = _epmoe.mpi_communicator(handle)
    _install_exit_handlers()
    _mpi_communicators.add(communicator)
    return communicator


def communicator_of(value, what: str):
    """An epmoe.Communicator for `value`: one already, an mpi4py
    communicator (through mpi_communicator), or None (a single rank)."""
    if value is None or isinstance(value, Communicator):
        return value
    if type(value).__module__ == "mpi4py.MPI":
        return mpi_communicator(value)
    raise TypeError(f"{what}: communicator must be an epmoe.Communicator (ThreadsWorld(R).communicator(r), "
                    f"mpi_communicator(comm)), an mpi4py communicator or None, got {type(value).__name__}")
