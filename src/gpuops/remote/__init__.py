"""Everything that talks to the remote host: connection, host keys, command execution, the probe, shell quoting
(rsync, which moves files, is transfer/rsync.py)."""
