"""The result cache: its key, the memory tier and the disk tier. Imports nothing of the daemon but `errors`."""
