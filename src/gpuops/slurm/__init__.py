"""Slurm clusters (issue 41): Slurm is the engine, gpuops speaks to it through sinfo, squeue, sacct, scontrol, sbatch,
srun and scancel on the login node.

- states: a job's state as squeue, sacct and scontrol print it (pure): a job in the queue, a job's end as the facts
  the endings classifier is given, GPU-hours; and the formats the talking part asks for.
- nodes: the cluster's nodes as sinfo and scontrol print them (pure): states, flags, gres, a drained node's reason.
- reasons: a pending job's reason in words, with its fix (pure; playbooks/slurm_reasons.yaml).
- batch: the batch script and sbatch's argument list (pure): #SBATCH lines, the environment, the resume file a
  requeued job reads, srun starting torchrun (c10d rendezvous on the allocation's first node) or a plain command.
- commands: the talking part (argument lists over the login node's one connection).
- runstate: a gpuops run's Slurm job judged (pure): its status row, GPU-hours, the ending's facts.
- runs: train, status, logs, stop on a cluster, step by step over the login node's connection.
- verify on a cluster: probe_step (pure: the one srun step's arguments and script, the probe's output tagged per
  node and split back), cluster_checks (pure: the profile's `slurm:` against sinfo/scontrol, the nodes' states),
  cluster (talking: the login node's facts, the step, why the nodes were busy), verify_cluster (composes them with
  verify's checks, the fleet checks and the report), report_text (pure: the cluster's lines).
- profile_draft: `profiles new --slurm`, the profile written from the login node's sinfo and scontrol.
"""
