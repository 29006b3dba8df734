"""Imported by every Python process of a job started by ``diagnose run``.

``diagnose run`` puts this folder first on PYTHONPATH so Python imports this module at
start-up, before the user's code. It prepares what the supervisor needs when ptrace is
refused (no py-spy): the stack of every thread on a signal, written by faulthandler from
its C signal handler, which works while the main thread is blocked in a collective. With
``DIAGNOSE_FR_DIR`` set it also waits, on a thread blocked in ``open()`` of a FIFO (no
CPU), for a request to dump torch's Flight Recorder, since gloo never dumps on timeout.

With ``DIAGNOSE_DIE_WITH`` set it also asks the kernel to KILL this process when its parent
dies, if the parent is in the same chain (the job's first process, started so by the
supervisor, or a Python process that did this itself): killing ``diagnose run`` outright
then takes torchrun and, through it, the ranks and their ports.

Nothing here may break the user's program: every step is guarded, and the site's own
``sitecustomize`` (if any) still runs afterwards.
"""

import os


def _die_with_parent() -> None:
    chain = os.environ.get("DIAGNOSE_DIE_WITH")
    parent = os.getppid()
    if not chain or not (chain == str(parent) or (chain == "leader" and os.getsid(0) == parent)):
        return
    import ctypes
    import signal
    import sys

    # probes.proc.die_with_parent does this for the job's first process; here it runs inside
    # the user's own interpreter, where probes may not be importable, so it asks the kernel itself
    if (
        sys.platform.startswith("linux") and ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0
    ):  # PR_SET_PDEATHSIG
        os.environ["DIAGNOSE_DIE_WITH"] = str(os.getpid())
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(128 + int(signal.SIGKILL))


def _install() -> None:
    _die_with_parent()
    hook_dir = os.environ.get("DIAGNOSE_HOOK_DIR")
    if not hook_dir:
        return
    import faulthandler
    import json
    import signal
    import threading

    pid = os.getpid()
    stacks = open(os.path.join(hook_dir, f"{pid}.stack"), "w")  # noqa: SIM115 - held for the process's life
    number = int(os.environ["DIAGNOSE_HOOK_SIGNAL"])
    # faulthandler puts back the disposition it found when the interpreter shuts down; a
    # request arriving then must find "ignore", not the default, which ends the process
    signal.signal(number, signal.SIG_IGN)
    faulthandler.register(number, file=stacks, all_threads=True, chain=False)
    globals()["_stacks_file"] = stacks
    fr_dir = os.environ.get("DIAGNOSE_FR_DIR")
    if fr_dir and hasattr(os, "mkfifo"):
        fifo = os.path.join(hook_dir, f"{pid}.fr")
        os.mkfifo(fifo, 0o600)
        threading.Thread(target=_serve_flight_recorder, args=(fifo, fr_dir), name="diagnose-fr", daemon=True).start()
    marker = {"pid": pid, "main_thread": threading.get_ident()}
    with open(os.path.join(hook_dir, f"{pid}.json.tmp"), "w") as f:
        json.dump(marker, f)
    os.replace(os.path.join(hook_dir, f"{pid}.json.tmp"), os.path.join(hook_dir, f"{pid}.json"))


def _serve_flight_recorder(fifo: str, fr_dir: str) -> None:
    import sys

    while True:
        with open(fifo) as request:  # blocks until the supervisor opens it for writing
            request.read()
        try:
            distributed = sys.modules.get("torch.distributed")
            if distributed is None or not distributed.is_initialized():
                continue  # the finally below still answers
            from torch._C._distributed_c10d import _dump_fr_trace_json

            dump = _dump_fr_trace_json(True, True)
            path = os.path.join(fr_dir, f"rank{distributed.get_rank()}.json")
            with open(path + ".tmp", "wb") as out:
                out.write(dump.encode() if isinstance(dump, str) else dump)  # bytes in torch >= 2.10
            os.replace(path + ".tmp", path)
        except Exception:  # noqa: BLE001 - a failed dump must never disturb the job
            pass
        finally:
            # answered, dump or none (not initialised yet): the supervisor stops waiting for us
            try:
                open(fifo + "-done", "w").close()
            except OSError:
                pass


def _chain() -> None:
    """Run the sitecustomize this one shadows, if the environment has one."""
    import importlib.machinery
    import importlib.util
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _install()
except Exception:  # noqa: BLE001 - the job runs without the fallback rather than not at all
    pass
_chain()  # its errors are reported by site.py exactly as they would be without this hook
