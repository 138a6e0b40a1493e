"""Everything that talks to the remote host: connection, host keys, command execution, the probe."""
