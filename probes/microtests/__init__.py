"""Micro-tests: real ranks, real ``torch.distributed``, each under a hard deadline.

``run_microtests(names=None, *, nproc=None, backend=None, timeout=60.0, strategy="ddp",
progress=None) -> Facts.microtests``. The ranks are separate processes (``python -m
probes.microtests.worker``, the same interpreter) that rendezvous through a TCP store on
127.0.0.1 on a free port: NCCL on CUDA devices where the torch build and a GPU allow, gloo on
CPU otherwise. The tests that use the same ranks run as the steps of one launch, which imports
torch once (on a machine without GPUs, rank 0 imports torch and Lightning and forks the other
ranks); each step has its own deadline (``timeout``) and its own result. A watchdog kills
the whole process tree when a step's deadline passes or one rank has failed, and reports where
each rank got to; the steps after a failed one run in a new launch. Two ranks sharing one GPU,
Lightning's ddp_spawn and the NCCL variants below get launches of their own. Importing this
package does not import torch; only the ranks do.

``progress(test, state, detail)`` is called with state ``running`` (also once per variant,
detail ``variant NAME``), then ``passed``, ``failed``, ``timed_out`` or ``skipped`` (detail: a
one-line summary, the error, or the reason).

Each test is a ``MicroTest``: ``status``, ``duration_s``, ``backend``, ``nproc``, ``reason``
(skipped), ``error`` (the first failure in time: later errors on other ranks are its echoes),
``ranks`` (``"0": "done; exit 0"``, ``"1": "barrier; killed by the watchdog at the 5 s
deadline"``, ``"1": "all_reduce 1KB; signal SIGSEGV"``) and ``measurements``, fact paths
``microtests.<test>.measurements.<name>``:

rendezvous
    ``init_s``, ``first_collective_s`` (slowest rank); on failure ``error_kind``:
    ``address_in_use``, ``connection_refused``, ``timeout``, ``hostname`` or ``other``.
barrier
    ``barrier_s``; ``missing_ranks`` (comma-separated, ``""`` when none), ``missing_count``,
    ``arrived_count``. ``dist.monitored_barrier`` names the missing ranks (under NCCL it runs on
    a gloo side group before the NCCL barrier); when the watchdog had to kill, a rank that never
    entered the barrier is missing.
all_reduce
    ``correct`` (every rank got the exact sum at every size; None when the sweep did not finish),
    ``dtype``; per size ``time_us_<S>``, ``algbw_gbps_<S>``, ``busbw_gbps_<S>`` for S in 1KB,
    4KB, 16KB, 64KB, 256KB, 1MB, 4MB, 16MB, 64MB; ``algbw_gbps_max``, ``busbw_gbps_max``,
    ``busbw_gbps_avg``. As nccl-tests: in place, time averaged over ranks,
    algbw = bytes / time, busbw = algbw * 2 (n-1) / n, GB/s = 1e9 bytes/s. With a single rank
    no data crosses a bus: the ``busbw`` keys are absent (nccl-tests print 0).
placement (CUDA only)
    Per NVML, while every rank holds memory on its own GPU (``rank % count``):
    ``foreign_ranks_on_gpu0`` (ranks whose own GPU is not 0 holding memory on visible GPU 0)
    and ``gpu0_foreign_ranks``, ``ranks_on_foreign_device`` and ``foreign_device_ranks`` (on
    any GPU not their own; one or more fails the test), ``nvml_pids_matched`` (False in a
    container whose pids NVML cannot see: the counts are then unknown), ``nvml_error``.
duplicate_gpu (CUDA only)
    ``mode``: ``distinct`` (each rank takes GPU ``rank % count``): ``distinct_devices``,
    ``duplicates``, ``duplicate_ranks`` (by GPU UUID; duplicates fail the test); ``shared``
    (one GPU: two NCCL ranks on it on purpose): ``nccl_error``, ``nccl_rejects_shared``.
lightning_fit
    ``strategy``, ``fit_s``, ``global_step`` (expected: 4), ``loss_finite``.

``variants``: when rendezvous, barrier or all_reduce fails or hangs under NCCL, it is run again
with ``NCCL_P2P_DISABLE=1`` (``p2p_disabled``), ``NCCL_SHM_DISABLE=1`` (``shm_disabled``),
``NCCL_IB_DISABLE=1`` (``ib_disabled``) and on gloo (``gloo``), each with the test's status.
"""

from probes.microtests.runner import TEST_NAMES, run_microtests

__all__ = ["TEST_NAMES", "run_microtests"]
