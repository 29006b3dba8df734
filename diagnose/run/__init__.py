"""``diagnose run -- CMD``: supervise a training job, catch a hang, name its cause.

One job per module: ``command`` (options, the run from start to printed report), ``jobenv``
(the job's environment), ``supervise`` (start, interrupts, teardown), ``tee`` (the output
passed through and kept), ``watch`` (CPU and output sampling, hang detection), ``facts``
(Facts from what was seen), ``summary`` (the lines on stderr).

The command starts in its own session (so its whole tree can be signalled as one group),
its output passes through unchanged (its stdout goes to stderr when stdout must carry a
JSON or markdown document) and a copy is kept in ``OUT/output.log``. Progress is new
output, or a rank process using more than ``CPU_BUSY`` of a core or reading or writing
anything (a rank importing torch from a slow disk uses little CPU). After
``--hang-after`` seconds without progress the job is declared hung; so is a job silent for
that long whose ranks waiting on their peers (``probes.hang.PEER_WAITS``) are found twice,
half a ``--hang-after`` apart, at the same place while some rank stays busy (NCCL busy-waits
at 100% CPU; a rank may compute a long evaluation while the others wait for it). Then every
rank's stack is taken (``probes.hang``), the tree is ended (TERM, then KILL after
``--grace``) unless ``--keep``, and the output up to the moment of the hang goes through the
offline log reader. A job that ends by itself is diagnosed from its log alone. The report
is printed and saved in OUT with the log.

Process hygiene: ``diagnose run`` is a child subreaper (Linux), so a daemon the job
double-forks is re-parented to it and ended with the job; the job's first process, and
through the start-up hook every Python process of the job, gets a parent-death signal, so
killing the supervisor outright (kill -9) still takes the ranks and their ports down. A
first SIGINT is passed to the job (its own Ctrl-C handling runs); a second one, or a
SIGTERM, ends the job: TERM, then KILL after ``--grace``.

Exit status: the job's own when it ended by itself (128+N for a signal N), ``Exit.FINDINGS``
(1) for a hang, 130 / 143 when interrupted by SIGINT / SIGTERM; 2 and 3 as everywhere else.
"""
