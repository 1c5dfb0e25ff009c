"""A real multi-node Slurm cluster on this machine: munge, mariadb, slurmdbd, slurmctld, N slurmd.

The daemons are real; only their hosts are simulated, each slurmd in its own network and UTS
namespace, so jobs see distinct hostnames and addresses.
"""
