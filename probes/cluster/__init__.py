"""The ``cluster`` section: one job's ranks across nodes, seen from inside the job.

``run(options)`` is called in every rank of a job that torchrun or srun started (one process
per GPU, like the training job). Each rank reads who it is from the launcher's variables, its
node's local rank 0 collects the node's facts (``probes.collect``), every rank notes its own
device, the micro-tests run in the job's own process group (so the real inter-node path
carries them), and rank 0 gathers it all into one ``Facts`` with ``Facts.cluster`` filled.

The control plane is the job's TCP store (torchrun's agent store, or one rank 0 hosts as
``env://`` would), not a collective: each rank writes when it arrives, every step it enters
and its results as keys, so rank 0 can always say who arrived where, even when a collective
hangs or a node never starts. Every wait has a deadline, and each rank runs its own watchdog
thread that ends the process at the hard deadline (rank 0 first hands what it has to
``on_expiry``, which writes the report).

One job per module: ``identity`` (who this rank is, where the launcher puts the others),
``options`` (the deadlines), ``store`` (the control-plane protocol over the store), ``rank``
(one rank's run: facts, device, the collectives, its part to the end) and ``assemble`` (rank 0
puts the job's Facts together, the micro-tests judged by ``probes.microtests.judge``).
"""
